"""Bad input: every public function given None, wrong types, negative and huge sizes, or closed
objects raises the documented TypeError / ValueError / RuntimeError / OverflowError with a clear
message; nothing crashes and nothing half-changes (docs/reference-notes.md section 3.11;
docs/decisions.md D4, D5)."""

import sys

import pytest

import custody
from conftest import RecordingResource

HUGE = 2**64
ABOVE_ISIZE = 2**63


@pytest.fixture
def pool(device):
    return custody.DeviceMemoryResource(0)


@pytest.fixture
def buf(pool, stream):
    b = pool.allocate(64, stream=stream)
    yield b
    b.close()


@pytest.fixture
def closed_buf(pool, stream):
    b = pool.allocate(64, stream=stream)
    b.close()
    return b


@pytest.fixture
def closed_stream(device):
    s = device.create_stream()
    s.close()
    return s


def check(exc, pattern, fn):
    """fn() raises exc (exactly that class or a subclass) with a message matching pattern (any
    non-empty message when pattern is empty)."""
    with pytest.raises(exc, match=pattern or None) as info:
        fn()
    assert str(info.value), "the message says what was wrong"


@pytest.mark.parametrize(
    "size, exc, pattern",
    [
        (None, TypeError, "NoneType"),
        ("10", TypeError, "str"),
        (1.5, TypeError, "float"),
        (-1, OverflowError, ""),
        (HUGE, OverflowError, ""),
        (ABOVE_ISIZE, OverflowError, "isize::MAX"),
    ],
)
@pytest.mark.parametrize(
    "make",
    [
        lambda: custody.DeviceMemoryResource(0),
        lambda: custody.PinnedMemoryResource(),
        lambda: custody.LegacyPinnedMemoryResource(),
        lambda: custody.ManagedMemoryResource(),
        lambda: custody.SynchronousMemoryResource(0),
        lambda: custody.GraphMemoryResource(0),
    ],
    ids=["device", "pinned", "legacy-pinned", "managed", "synchronous", "graph"],
)
def test_allocate_sizes(device, stream, make, size, exc, pattern):
    mr = make()
    check(exc, pattern, lambda: mr.allocate(size, stream=stream))


@pytest.mark.parametrize(
    "stream_arg, exc, pattern",
    [
        (None, TypeError, "stream is required and must not be None"),
        (object(), TypeError, "Stream .* expected, got object"),
        (1, TypeError, "expected, got int"),
    ],
)
def test_allocate_streams(pool, stream_arg, exc, pattern):
    check(exc, pattern, lambda: pool.allocate(64, stream=stream_arg))


def test_allocate_stream_is_required_and_keyword_only(pool, stream, closed_stream):
    check(TypeError, "stream", lambda: pool.allocate(64))
    check(TypeError, "positional", lambda: pool.allocate(64, stream))
    check(RuntimeError, "Stream has been closed", lambda: pool.allocate(64, stream=closed_stream))


def test_deallocate_arguments(pool, stream):
    check(TypeError, "NoneType", lambda: pool.deallocate(None, 8, stream=stream))
    check(OverflowError, "", lambda: pool.deallocate(-1, 8, stream=stream))
    check(OverflowError, "", lambda: pool.deallocate(0x1000, -8, stream=stream))
    check(TypeError, "stream is required", lambda: pool.deallocate(0x1000, 8, stream=None))


@pytest.mark.parametrize(
    "ctor, exc, pattern",
    [
        (lambda: custody.DeviceMemoryResource(None), TypeError, "got None"),
        (lambda: custody.DeviceMemoryResource("0"), TypeError, "expected, got str"),
        (lambda: custody.DeviceMemoryResource(-1), ValueError, "not negative"),
        (lambda: custody.DeviceMemoryResource(2**40), ValueError, "out of range"),
        (lambda: custody.DeviceMemoryResource(99), custody.CUDAError, "CUDA_ERROR_INVALID_DEVICE"),
        (lambda: custody.DeviceMemoryResource(0, {"max_size": -1}), OverflowError, "max_size"),
        (lambda: custody.DeviceMemoryResource(0, {"ipc_enabled": "yes"}), TypeError, "ipc_enabled"),
        (lambda: custody.SynchronousMemoryResource(None), TypeError, "got None"),
        (lambda: custody.SynchronousMemoryResource(99), custody.CUDAError, "CUDA_ERROR_INVALID_DEVICE"),
        (lambda: custody.GraphMemoryResource(-1), ValueError, "within"),
        (lambda: custody.PinnedMemoryResource({"max_size": "big"}), TypeError, "max_size"),
    ],
)
def test_resource_constructors(device, ctor, exc, pattern):
    check(exc, pattern, ctor)


@pytest.mark.parametrize("bad", [5, "abc", object(), 1.5, [("ipc_enabled", True)]])
def test_options_of_another_type_are_refused_as_cuda_core_does(device, bad):
    """cuda.core 1.2 builds its options dataclass from a dict and refuses every other type with
    TypeError; custody did the same nowhere and made a default pool or stream instead."""
    for make in [
        lambda: custody.DeviceMemoryResource(0, bad),
        lambda: custody.PinnedMemoryResource(bad),
        lambda: custody.ManagedMemoryResource(bad),
        lambda: device.create_stream(options=bad),
        lambda: device.create_event(options=bad),
    ]:
        check(TypeError, "must be provided as an object of type .*Options or as a dict", make)


@pytest.mark.parametrize(
    "make, key",
    [
        (lambda d, o: custody.DeviceMemoryResource(0, o), "ipc_enable"),
        (lambda d, o: custody.PinnedMemoryResource(o), "max_sizes"),
        (lambda d, o: custody.ManagedMemoryResource(o), "preferred"),
        (lambda d, o: d.create_stream(options=o), "non_blocking"),
        (lambda d, o: d.create_event(options=o), "timing"),
    ],
)
def test_misspelled_option_names_are_refused(device, make, key):
    """An unknown dict key is a TypeError naming it (as ``Options(**dict)`` in cuda.core), not a
    silently ignored option: ``{'ipc_enable': True}`` made a non-IPC pool and
    ``{'non_blocking': False}`` a non-blocking stream."""
    check(TypeError, f"unexpected keyword argument '{key}'", lambda: make(device, {key: True}))
    check(TypeError, "must be strings", lambda: make(device, {1: True}))


def test_options_dataclasses_and_valid_dicts_still_work(device):
    mr = custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions(max_size=0))
    mr.close()
    mr = custody.DeviceMemoryResource(0, {"max_size": 0})
    mr.close()
    s = device.create_stream(options={"nonblocking": False})
    assert not s.is_nonblocking
    s.close()
    s = device.create_stream(options=custody.StreamOptions(nonblocking=True))
    assert s.is_nonblocking
    s.close()


@pytest.mark.parametrize(
    "args, kwargs, exc, pattern",
    [
        ((None, 8), {}, TypeError, "pointer .* got None"),
        (("x", 8), {}, TypeError, "expected, got str"),
        ((-1, 8), {}, OverflowError, "unsigned 64-bit"),
        ((HUGE, 8), {}, OverflowError, "unsigned 64-bit"),
        ((0x1000, None), {}, TypeError, "NoneType"),
        ((0x1000, -1), {}, OverflowError, ""),
        ((0x1000, HUGE), {}, OverflowError, ""),
        ((0x1000, 8), {"mr": "x"}, TypeError, "MemoryResource expected, got str"),
        ((0x1000, 8), {"stream": 1}, ValueError, "stream requires a memory resource"),
        ((2**64 - 8, 16), {}, ValueError, "wraps past the end of the address space"),
        ((2**64 - 8, 8), {}, ValueError, "wraps past the end of the address space"),
    ],
)
def test_from_handle_arguments(device, args, kwargs, exc, pattern):
    check(exc, pattern, lambda: custody.Buffer.from_handle(*args, **kwargs))
    check(exc, pattern, lambda: custody.ManagedBuffer.from_handle(*args, **kwargs))


def test_from_handle_with_mr_refuses_without_taking_ownership(device, stream):
    rec = RecordingResource()
    ptr = rec.raw_allocate(64, stream)
    for size, exc in [(0, ValueError), (ABOVE_ISIZE, OverflowError)]:
        check(exc, "", lambda: custody.Buffer.from_handle(ptr, size, mr=rec, stream=stream))
    check(ValueError, "null pointer", lambda: custody.Buffer.from_handle(0, 8, mr=rec, stream=stream))
    check(TypeError, "Stream", lambda: custody.Buffer.from_handle(ptr, 64, mr=rec, stream=object()))
    for wrapping in [lambda: custody.Buffer.from_handle(2**64 - 8, 16, mr=rec, stream=stream),
                     lambda: custody.ManagedBuffer.from_handle(2**64 - 8, 16, mr=rec, stream=stream)]:
        check(ValueError, "wraps past the end", wrapping)
    assert rec.calls == [] and list(rec.live) == [ptr]
    rec.release_all()


@pytest.mark.parametrize("cls", [custody.Buffer, custody.ManagedBuffer])
def test_from_handle_with_size_zero_is_a_zero_size_view_and_refused_with_mr(device, stream, cls):
    """What ``from_handle``'s docstring says of ``size`` 0: without ``mr`` (a view, or kept alive
    by ``owner``) a zero-size buffer over ``ptr`` (0 allowed for a view) that frees nothing;
    with ``mr`` a ``ValueError``, and ``deallocate`` is never called."""
    rec = RecordingResource()
    ptr = rec.raw_allocate(64, stream)
    owner = object()
    held = sys.getrefcount(owner)
    for view in [cls.from_handle(ptr, 0), cls.from_handle(0, 0), cls.from_handle(ptr, 0, owner=owner)]:
        assert type(view) is cls and view.size == 0 and not view.is_closed
        assert view.handle in (ptr, 0)
        view.close()
        assert view.is_closed
    assert sys.getrefcount(owner) == held, "the owner was let go"
    check(ValueError, "null pointer", lambda: cls.from_handle(0, 0, owner=owner))
    check(ValueError, "invalid size of 0 bytes", lambda: cls.from_handle(ptr, 0, mr=rec))
    check(ValueError, "invalid size of 0 bytes",
          lambda: cls.from_handle(ptr, 0, mr=rec, stream=stream))
    assert rec.calls == [] and list(rec.live) == [ptr], "nothing freed, nothing taken"
    for doc in (cls.from_handle.__doc__, custody.Buffer.from_handle.__doc__):
        assert "``size`` 0" in doc, doc
    rec.release_all()


def test_buffer_methods_bad_arguments(buf, stream, pool):
    check(TypeError, "requires a Stream, got None", lambda: buf.set_deallocation_stream(None))
    check(TypeError, "expected, got int", lambda: buf.set_deallocation_stream(1))
    check(TypeError, "expected, got str", lambda: buf.close(stream="x"))
    check(TypeError, "Buffer expected, got str", lambda: buf.copy_to("x", stream=stream))
    check(TypeError, "stream is required", lambda: buf.copy_to(stream=None))
    check(TypeError, "stream", lambda: buf.copy_to())
    check(TypeError, "Buffer expected, got NoneType", lambda: buf.copy_from(None, stream=stream))
    other = pool.allocate(32, stream=stream)
    check(ValueError, "size mismatch", lambda: buf.copy_to(other, stream=stream))
    check(ValueError, "size mismatch", lambda: buf.copy_from(other, stream=stream))
    other.close()
    check(OverflowError, r"\[0, 256\)", lambda: buf.fill(256, stream=stream))
    check(OverflowError, r"\[0, 256\)", lambda: buf.fill(-1, stream=stream))
    check(OverflowError, r"\[0, 256\)", lambda: buf.fill(2**70, stream=stream))
    check(ValueError, "1, 2 or 4 bytes", lambda: buf.fill(b"\x01\x02\x03", stream=stream))
    check(TypeError, "got None", lambda: buf.fill(None, stream=stream))
    check(TypeError, "expected, got float", lambda: buf.fill(1.5, stream=stream))
    check(TypeError, "stream is required", lambda: buf.fill(1, stream=None))
    odd = pool.allocate(3, stream=stream)
    check(ValueError, "multiple of the pattern", lambda: odd.fill(b"\x01\x02", stream=stream))
    odd.close()
    check(RuntimeError, "ipc", lambda: buf.ipc_descriptor)
    assert not buf.is_closed and buf.size == 64, "nothing half-changed"


def test_closed_buffer_raises_runtime_error(closed_buf, buf, stream):
    for attempt in (
        lambda: closed_buf.is_device_accessible,
        lambda: closed_buf.is_host_accessible,
        lambda: closed_buf.is_managed,
        lambda: closed_buf.device_id,
        lambda: closed_buf.ipc_descriptor,
        lambda: closed_buf.__dlpack__(),
        lambda: closed_buf.__dlpack_device__(),
        lambda: closed_buf.copy_to(stream=stream),
        lambda: closed_buf.copy_to(buf, stream=stream),
        lambda: buf.copy_from(closed_buf, stream=stream),
        lambda: closed_buf.fill(1, stream=stream),
        lambda: closed_buf.set_deallocation_stream(stream),
        lambda: closed_buf.close(stream=stream),
    ):
        check(RuntimeError, "Buffer has been closed", attempt)
    closed_buf.close()
    assert (closed_buf.handle, closed_buf.size, closed_buf.memory_resource) == (0, 0, None)


def test_dlpack_bad_arguments(buf):
    check(BufferError, "dl_device other than None", lambda: buf.__dlpack__(dl_device=(1, 0)))
    check(BufferError, "copy=True", lambda: buf.__dlpack__(copy=True))
    check(BufferError, "max_version", lambda: buf.__dlpack__(max_version="x"))
    check(BufferError, "dl_device", lambda: buf.__dlpack__(dl_device="x"))


def test_stream_and_event_bad_input(device, closed_stream, stream):
    check(TypeError, "got None", lambda: custody.Stream.from_handle(None))
    check(TypeError, "expected, got str", lambda: custody.Stream.from_handle("x"))
    check(OverflowError, "", lambda: custody.Stream.from_handle(-1))
    check(TypeError, "got None", lambda: stream.wait(None))
    check(ValueError, "can be waited on, got str", lambda: stream.wait("x"))
    for attempt in (
        lambda: closed_stream.sync(),
        lambda: closed_stream.record(),
        lambda: closed_stream.wait(stream),
        lambda: stream.wait(closed_stream),
        lambda: closed_stream.handle,
        lambda: closed_stream.__cuda_stream__(),
        lambda: closed_stream.context,
    ):
        check(RuntimeError, "Stream has been closed", attempt)
    closed_stream.close()

    class BadProtocol:
        def __cuda_stream__(self):
            return "nope"

    class WrongVersion:
        def __cuda_stream__(self):
            return (7, 0x1234)

    pool = custody.DeviceMemoryResource(0)
    check(TypeError, "version, handle", lambda: pool.allocate(8, stream=BadProtocol()))
    check(ValueError, "version 7", lambda: pool.allocate(8, stream=WrongVersion()))
    check(RuntimeError, "cannot be instantiated", lambda: custody.Event())


def test_device_bad_input(device):
    check(TypeError, "must be an int", lambda: custody.Device("0"))
    check(ValueError, "within", lambda: custody.Device(-1))
    check(ValueError, "within", lambda: custody.Device(99))
    check(TypeError, "Context expected", lambda: device.set_current("x"))
    check(TypeError, "__cuda_stream__", lambda: device.create_stream(object()))
    check(TypeError, "MemoryResource expected", lambda: setattr(device, "memory_resource", 1))
    check(TypeError, "stream", lambda: device.allocate(8))


def test_ipc_bad_input(device, stream, pool):
    check(TypeError, "DeviceMemoryResource or PinnedMemoryResource expected, got NoneType",
          lambda: custody.Buffer.from_ipc_descriptor(None, b"", stream=stream))
    check(TypeError, "expected, got LegacyPinnedMemoryResource",
          lambda: custody.Buffer.from_ipc_descriptor(custody.LegacyPinnedMemoryResource(), b"", stream=stream))
    check(TypeError, "stream is required",
          lambda: custody.Buffer.from_ipc_descriptor(pool, b"", stream=None))
    check(TypeError, "stream", lambda: custody.Buffer.from_ipc_descriptor(pool, b""))
    check(RuntimeError, "not IPC-enabled",
          lambda: custody.Buffer.from_ipc_descriptor(pool, b"", stream=stream))
    exporter = custody.DeviceMemoryResource(0, {"ipc_enabled": True})
    exported = exporter.allocate(64, stream=stream)
    check(RuntimeError, "not a pool imported",
          lambda: custody.Buffer.from_ipc_descriptor(exporter, exported.ipc_descriptor, stream=stream))
    check(ValueError, "payload is 8 bytes; expected at least 64",
          lambda: custody.Buffer.from_ipc_descriptor(
              exporter, custody.IPCBufferDescriptor._init(b"\0" * 8, 64), stream=stream))
    exported.close()
    check(ValueError, "96", lambda: custody.IPCBufferDescriptor.from_bytes(b"short"))
    check(TypeError, "", lambda: custody.IPCBufferDescriptor.from_bytes(None))
    check(RuntimeError, "ipc_enabled", lambda: pool.get_allocation_handle())
    check(ValueError, "non-negative", lambda: custody.DeviceMemoryResource.from_allocation_handle(0, -1))
    check(TypeError, "file descriptor", lambda: custody.DeviceMemoryResource.from_allocation_handle(0, "x"))


@pytest.mark.parametrize("cls", [custody.Buffer, custody.ManagedBuffer])
def test_from_handle_refuses_sizes_over_isize_max_first(device, stream, cls):
    """A size over ``isize::MAX`` is refused as ``allocate`` refuses it (``OverflowError``),
    before anything else: without ``mr`` no buffer is made, with ``mr`` ``deallocate`` is never
    called, and an ``owner`` is not kept."""
    rec = RecordingResource()
    ptr = rec.raw_allocate(64, stream)
    owner = object()
    held = sys.getrefcount(owner)
    message = "no allocation can exceed isize::MAX bytes"
    check(OverflowError, message, lambda: custody.DeviceMemoryResource(0).allocate(ABOVE_ISIZE, stream=stream))
    for size in (ABOVE_ISIZE, HUGE - 1):
        check(OverflowError, message, lambda: cls.from_handle(1, size))
        check(OverflowError, message, lambda: cls.from_handle(ptr, size, owner=owner))
        check(OverflowError, message, lambda: cls.from_handle(ptr, size, mr=rec, stream=stream))
        # Found before the other checks (a wrapping range, a stream without mr).
        check(OverflowError, message, lambda: cls.from_handle(HUGE - 1, size))
        check(OverflowError, message, lambda: cls.from_handle(ptr, size, stream=stream))
    assert sys.getrefcount(owner) == held, "the owner was not kept"
    assert rec.calls == [] and list(rec.live) == [ptr], "nothing freed, nothing taken"
    # isize::MAX itself is not refused for being too large (a view is the caller's word).
    view = cls.from_handle(0, ABOVE_ISIZE - 1)
    assert view.size == ABOVE_ISIZE - 1
    view.close()
    rec.release_all()


def test_a_negative_size_names_the_argument(device, stream):
    """A negative size is refused naming the argument (pyo3's conversion said
    only "can't convert negative int to unsigned")."""
    mr = custody.DeviceMemoryResource(0)
    for call in [
        lambda: mr.allocate(-1, stream=stream),
        lambda: custody.LegacyPinnedMemoryResource().allocate(-3),
        lambda: custody.Buffer.from_handle(0x1000, -1),
        lambda: custody.ManagedBuffer.from_handle(0x1000, -1),
        lambda: mr.deallocate(0x1000, -8, stream=stream),
    ]:
        check(OverflowError, r"size must be a number of bytes from 0 to 2\*\*64 - 1, got -", call)
    check(OverflowError, r"size must be .* got 1180591620717411303424", lambda: mr.allocate(2**70, stream=stream))
    check(TypeError, "size: .*str", lambda: mr.allocate("10", stream=stream))


class _Index:
    """An int-like through ``__index__`` (a NumPy integer, say)."""

    def __init__(self, value):
        self.value = value

    def __index__(self):
        return self.value


class _Int:
    """A pointer-like through ``__int__`` (``cuda.bindings.driver.CUdeviceptr``, say)."""

    def __init__(self, value):
        self.value = value

    def __int__(self):
        return self.value


def test_an_int_like_out_of_range_is_named_by_its_value(device, stream):
    """A size or pointer given as an object with ``__index__`` or ``__int__`` whose value is out
    of range is refused naming the value it gave, not the object's repr."""
    mr = custody.DeviceMemoryResource(0)
    check(OverflowError, r"size must be .* got -8$", lambda: mr.allocate(_Index(-8), stream=stream))
    check(OverflowError, r"size must be .* got -8$", lambda: custody.Buffer.from_handle(0x1000, _Index(-8)))
    check(OverflowError, r"size must be .* got 1180591620717411303424$",
          lambda: mr.allocate(_Index(2**70), stream=stream))
    check(OverflowError, r"^a pointer is an unsigned 64-bit int, got -5$",
          lambda: custody.Buffer.from_handle(_Int(-5), 8))
    check(OverflowError, r"^a pointer is an unsigned 64-bit int, got -5$",
          lambda: custody.Buffer.from_handle(_Index(-5), 8))
    check(OverflowError, r"^a pointer is an unsigned 64-bit int, got -1$",
          lambda: custody.Buffer.from_handle(-1, 8))


@pytest.mark.parametrize("cls", [custody.Stream, custody.GraphBuilder])
def test_a_stream_class_instead_of_an_instance_names_the_mistake(device, stream, cls):
    """The class ``custody.Stream`` (or ``GraphBuilder``) where a stream goes
    is refused as such (calling the class's ``__cuda_stream__`` said "unbound method
    Stream.__cuda_stream__() needs an argument")."""
    buf = custody.DeviceMemoryResource(0).allocate(64, stream=stream)
    pattern = f"got the class {cls.__name__} itself"
    check(TypeError, pattern, lambda: buf.record_use(cls))
    check(TypeError, pattern, lambda: buf.set_deallocation_stream(cls))
    check(TypeError, pattern, lambda: buf.copy_to(stream=cls))
    check(TypeError, pattern, lambda: custody.Stream.from_handle(cls))
    check(TypeError, pattern, lambda: custody.DeviceMemoryResource(0).allocate(64, stream=cls))
    assert not buf.is_closed
    buf.close()


def test_a_negative_or_too_large_stream_handle_is_named(device, stream):
    """A stream handle that is no unsigned 64-bit int, given to ``Stream.from_handle`` or
    returned by an object's ``__cuda_stream__`` (wherever a stream goes), is refused naming the
    handle (pyo3's conversion said only "can't convert negative int to unsigned" or "int too big
    to convert")."""

    class Returns:
        def __init__(self, handle):
            self.handle = handle

        def __cuda_stream__(self):
            return (0, self.handle)

    buf = custody.DeviceMemoryResource(0).allocate(64, stream=stream)
    for bad in [-1, 2**64]:
        check(
            OverflowError,
            rf"^a stream handle is an unsigned 64-bit int, got {bad}$",
            lambda: custody.Stream.from_handle(bad),
        )
        returned = rf"^a stream handle is an unsigned 64-bit int \(the handle __cuda_stream__ returned\), got {bad}$"
        for call in [
            lambda: custody.Stream.from_handle(Returns(bad)),
            lambda: device.create_stream(Returns(bad)),
            lambda: buf.record_use(Returns(bad)),
            lambda: buf.set_deallocation_stream(Returns(bad)),
        ]:
            check(OverflowError, returned, call)
    check(
        TypeError,
        r"^int stream handle \(the handle __cuda_stream__ returned\) expected, got str$",
        lambda: custody.Stream.from_handle(Returns("x")),
    )
    buf.close()
