"""``custody.utils.StridedMemoryView`` (cuda.core 1.2's names and behaviour) and the buffer
export rule: views of NumPy host arrays and of custody pinned, managed and device buffers through
DLPack, the CUDA Array Interface and the array interface; read-only flags; the view keeping its
producer alive; the stream rules (the consumer stream passed to ``__dlpack__``, made to wait for
a CUDA Array Interface producer's stream); a custody buffer exported to a named consumer stream
declaring that stream a use, so its free is ordered after the consumer's work (the hazard
checker clean with the declaration, ``unordered_free`` without it); bad input. Runs on the
emulator and on a GPU (the bytes and attributes everywhere; the call log and the hazard checker
on the emulator)."""

import ctypes
import gc
import warnings
import weakref

import pytest

import custody
from conftest import DRIVER, needs_two_devices

np = pytest.importorskip("numpy")
from custody.utils import StridedMemoryView, args_viewable_as_strided_memory  # noqa: E402

SIZE = 256


def host_bytes(ptr, n):
    return ctypes.string_at(ptr, n)


# --- NumPy host arrays ---


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.int32),
        np.arange(36, dtype=np.float64).reshape(6, 6)[::2, ::3],
        np.ones((3, 4), order="F"),
        np.array(7, dtype=np.int16),
    ],
    ids=["1d", "strided", "fortran", "0d"],
)
@pytest.mark.parametrize("how", ["dlpack", "array_interface"])
def test_a_numpy_array_is_viewed_as_it_is(array, how, device):
    if how == "dlpack":
        view = StridedMemoryView.from_dlpack(array, stream_ptr=-1)
        assert view.device_id == -1
        assert view.__dlpack_device__() == (int(custody.DLDeviceType.kDLCPU), 0)
    else:
        view = StridedMemoryView.from_array_interface(array)
        assert view.device_id == device.device_id  # cuda.core 1.2: the current device
    assert view.ptr == array.ctypes.data
    assert view.shape == array.shape and view.size == array.size
    assert view.dtype == array.dtype
    counts = tuple(s // array.itemsize for s in array.strides)
    assert view.strides in ((None, counts) if array.flags.c_contiguous else (counts,))
    assert view.is_device_accessible is False and view.readonly is False
    assert view.exporting_obj is array
    # The view exports DLPack itself: NumPy reads the same elements through it.
    assert np.array_equal(np.from_dlpack(view), array)
    assert np.array_equal(np.from_dlpack(view, device="cpu"), array), "its own device asked for"
    with pytest.raises(BufferError, match="dl_device"):
        view.__dlpack__(dl_device=(int(custody.DLDeviceType.kDLCUDA), 0))


def test_a_read_only_array_gives_a_read_only_view_and_export(device):
    array = np.frombuffer(b"custody!", dtype=np.uint8)
    assert not array.flags.writeable
    for view in (
        StridedMemoryView.from_dlpack(array, stream_ptr=-1),
        StridedMemoryView.from_array_interface(array),
    ):
        assert view.readonly is True
        again = np.from_dlpack(view)
        assert not again.flags.writeable and again.tobytes() == b"custody!"


def test_the_view_keeps_the_producer_alive():
    array = np.arange(16, dtype=np.uint8)
    alive = weakref.ref(array)
    view = StridedMemoryView.from_dlpack(array, stream_ptr=-1)
    sliced = view.view(view._layout[4:8])
    del array, view
    gc.collect()
    assert alive() is not None, "a view of a view keeps the producer too"
    assert host_bytes(sliced.ptr, 4) == bytes(range(4, 8))
    del sliced
    gc.collect()
    assert alive() is None, "the last view let the producer go"


def test_views_export_sliced_layouts_and_dtypes(device):
    array = np.arange(20, dtype=np.int32).reshape(4, 5)
    view = StridedMemoryView.from_dlpack(array, stream_ptr=-1)
    part = view.view(view._layout[1:3, ::2])
    assert part.ptr == array[1:3, ::2].ctypes.data
    assert np.array_equal(np.from_dlpack(part), array[1:3, ::2])
    as_bytes = StridedMemoryView.from_dlpack(array.view(np.uint8), stream_ptr=-1)
    assert as_bytes.view(dtype=np.dtype("i1")).dtype == np.dtype("i1")
    with pytest.raises(ValueError, match="itemsize"):
        view.view(dtype=np.dtype("i2"))


def test_the_decorator_hands_proxies_to_the_function():
    seen = []

    @args_viewable_as_strided_memory((1,))
    def f(first, second):
        seen.append((first, second.obj, second.has_dlpack, second.view(-1).shape))

    array = np.zeros((2, 3))
    f("kept", array)
    assert seen == [("kept", array, True, (2, 3))]
    with pytest.raises(RuntimeError, match="does not support any data exchange protocol"):
        f("kept", object())


def test_the_constructor_form_warns_as_deprecated():
    array = np.zeros(4)
    with pytest.warns(DeprecationWarning, match="deprecated"):
        view = StridedMemoryView(array, stream_ptr=-1)
    assert view.ptr == array.ctypes.data
    with pytest.warns(DeprecationWarning, match="empty"):
        StridedMemoryView()


# --- custody buffers ---


@pytest.mark.parametrize(
    ("make", "dl_type"),
    [
        (lambda: custody.PinnedMemoryResource(), custody.DLDeviceType.kDLCUDAHost),
        (lambda: custody.LegacyManagedMemoryResource(), custody.DLDeviceType.kDLCUDAManaged),
        (lambda: custody.DeviceMemoryResource(0), custody.DLDeviceType.kDLCUDA),
    ],
    ids=["pinned", "managed", "device"],
)
@pytest.mark.parametrize("how", ["dlpack", "cai"])
def test_a_custody_buffer_is_viewed_through_both_protocols(device, stream, make, dl_type, how):
    buf = make().allocate(SIZE, stream=stream)
    buf.fill(0x2A, stream=stream)
    stream.sync()
    if how == "dlpack":
        view = StridedMemoryView.from_dlpack(buf, stream_ptr=stream.handle)
    else:
        view = StridedMemoryView.from_cuda_array_interface(buf, stream_ptr=stream.handle)
    assert view.ptr == buf.handle
    assert view.shape == (SIZE,) and view.dtype == np.dtype("uint8")
    assert view.is_device_accessible is True and view.readonly is False
    if dl_type != custody.DLDeviceType.kDLCUDAHost:
        assert view.device_id == device.device_id
    # (Pinned pool memory: DLPack's convention says device 0 for kDLCUDAHost, while the driver,
    # which the CUDA Array Interface path asks, may say the memory belongs to no device.)
    assert view.exporting_obj is buf
    assert view.__dlpack_device__()[0] == int(dl_type)
    if dl_type != custody.DLDeviceType.kDLCUDA:
        # Host-accessible memory: NumPy reads it through the view's own export.
        assert np.from_dlpack(view).tobytes() == b"\x2a" * SIZE
    del view
    buf.close()


def test_the_cuda_array_interface_of_a_buffer(device, stream):
    buf = custody.DeviceMemoryResource(0).allocate(SIZE, stream=stream)
    cai = buf.__cuda_array_interface__
    assert cai == {
        "shape": (SIZE,),
        "typestr": "|u1",
        "data": (buf.handle, False),
        "strides": None,
        "version": 3,
        "stream": stream.handle,
    }
    stream.sync()
    buf.set_deallocation_stream(custody.LEGACY_DEFAULT_STREAM)
    assert buf.__cuda_array_interface__["stream"] == 1, "the legacy token, never 0"
    buf.close()
    with pytest.raises(RuntimeError, match="closed"):
        buf.__cuda_array_interface__


def test_a_view_of_a_buffer_keeps_its_memory_after_close(device, stream, emu):
    buf = custody.PinnedMemoryResource().allocate(SIZE, stream=stream)
    buf.fill(7, stream=stream)
    stream.sync()
    alloc = emu.alloc_id(buf.handle) if emu else None
    view = StridedMemoryView.from_dlpack(buf, stream_ptr=stream.handle)
    buf.close()
    assert host_bytes(view.ptr, SIZE) == b"\x07" * SIZE, "the tensor keeps the memory"
    if emu:
        assert emu.is_live(alloc)
    del view
    gc.collect()
    if emu:
        assert not emu.is_live(alloc), "freed when the view went"


# --- The export rule: the named consumer stream waits and is declared a use ---


def consumer_scene(device):
    """``buf`` (device memory; its free on ``a``) filled on ``a``; ``c``: the consumer's stream;
    ``out``: pinned memory the consumer copies into."""
    a, c = device.create_stream(), device.create_stream()
    buf = custody.DeviceMemoryResource(0).allocate(SIZE, stream=a)
    buf.fill(0x5A, stream=a)
    out = custody.LegacyPinnedMemoryResource().allocate(SIZE, stream=c)
    return a, c, buf, out


def consume(view, out, c):
    """The consumer's work on ``c``: a copy out of the viewed memory (a view that frees nothing)."""
    source = custody.Buffer.from_handle(view.ptr, SIZE)
    out.copy_from(source, stream=c)
    source.close()


def waits_on(emu, stream):
    return [c for c in emu.calls_to("cuStreamWaitEvent") if c["stream"] == stream.handle]


@pytest.mark.parametrize("how", ["dlpack", "cai", "__dlpack__"])
def test_an_export_to_a_named_stream_orders_the_consumer_and_the_free(device, emu, how):
    a, c, buf, out = consumer_scene(device)
    if emu:
        emu.clear_calls()
    if how == "dlpack":
        view = StridedMemoryView.from_dlpack(buf, stream_ptr=c.handle)
    elif how == "cai":
        view = StridedMemoryView.from_cuda_array_interface(buf, stream_ptr=c.handle)
    else:  # what CuPy's and PyTorch's from_dlpack do
        capsule = buf.__dlpack__(stream=c.handle, max_version=(1, 0))
        view = StridedMemoryView.from_buffer(buf, (SIZE,), itemsize=1)
        del capsule
    if emu:
        assert len(waits_on(emu, c)) == 1, "the consumer waited for the buffer's stream"
    consume(view, out, c)
    del view
    if emu:
        emu.clear_calls()
    buf.close()  # on a, declared after c: no unordered free (the autouse check)
    if emu:
        assert len(waits_on(emu, a)) == 1, "the free waited for the consumer's stream"
    c.sync()
    assert host_bytes(out.handle, SIZE) == b"\x5a" * SIZE
    out.close()
    a.sync()


@pytest.mark.expect_hazards("unordered_free")
def test_opting_out_with_minus_one_leaves_the_free_unordered(device, emu):
    if emu is None:
        pytest.skip("needs the emulated driver's hazard checker (on a GPU the free races the read)")
    a, c, buf, out = consumer_scene(device)
    a.sync()
    emu.clear_calls()
    view = StridedMemoryView.from_dlpack(buf, stream_ptr=-1)
    assert waits_on(emu, c) == [], "-1: no wait"
    consume(view, out, c)
    del view
    buf.close()  # on a: nothing declared, so not ordered after c's copy
    c.sync()
    out.close()


@pytest.mark.expect_hazards("unordered_free")
def test_a_bare_foreign_stream_waits_but_is_not_declared(device, emu):
    """A stream custody did not create, named by its int, cannot be kept alive by the buffer (a
    free waiting on a destroyed stream would kill the process), so the export makes it wait and
    declares nothing: the checker sees the unordered free."""
    if emu is None:
        pytest.skip("needs the emulated driver's hazard checker")
    raw = ctypes.c_void_p()
    assert DRIVER.cuStreamCreate(ctypes.byref(raw), 0) == 0
    foreign = custody.Stream.from_handle(raw.value)
    a, _c, buf, out = consumer_scene(device)
    emu.clear_calls()
    view = StridedMemoryView.from_dlpack(buf, stream_ptr=raw.value)
    assert len(waits_on(emu, foreign)) == 1, "the foreign stream waited"
    consume(view, out, foreign)
    del view
    buf.close()
    foreign.sync()
    out.close()
    del foreign
    assert DRIVER.cuStreamDestroy_v2(raw) == 0


def test_a_stream_of_another_device_is_refused_before_anything(device, emu):
    if custody.system.num_devices < 2:
        pytest.skip("needs two CUDA devices")
    a, c, buf, out = consumer_scene(device)
    other = custody.Device(1).create_stream()
    if emu:
        emu.clear_calls()
    with pytest.raises(ValueError, match="device"):
        StridedMemoryView.from_dlpack(buf, stream_ptr=other.handle)
    if emu:
        assert waits_on(emu, other) == [], "no wait made"
    device.set_current()
    buf.close()
    out.close()
    a.sync()


# --- Bad input ---


class CaiOnly:
    def __init__(self, **fields):
        self.__cuda_array_interface__ = {
            "shape": (4,), "typestr": "|u1", "data": (0, False), "version": 3, "strides": None,
            **fields,
        }


def test_bad_input_is_refused(device, stream):
    with pytest.raises(RuntimeError, match="does not support any data exchange protocol"):
        StridedMemoryView.from_any_interface(object(), stream_ptr=-1)
    with pytest.raises(BufferError, match="v3 or above"):
        StridedMemoryView.from_cuda_array_interface(CaiOnly(version=2), stream_ptr=-1)
    with pytest.raises(BufferError, match="mask"):
        StridedMemoryView.from_cuda_array_interface(CaiOnly(mask=object()), stream_ptr=-1)
    with pytest.raises(BufferError, match="0 is disallowed"):
        StridedMemoryView.from_cuda_array_interface(CaiOnly(stream=0), stream_ptr=-1)
    with pytest.raises(BufferError, match="ambiguous"):
        StridedMemoryView.from_cuda_array_interface(CaiOnly(), stream_ptr=None)
    with pytest.raises(TypeError, match="stream_ptr"):
        StridedMemoryView.from_cuda_array_interface(CaiOnly(), stream_ptr="1")
    with pytest.raises(BufferError, match="ambiguous"):
        StridedMemoryView.from_dlpack(np.zeros(2), stream_ptr=None)
    buf = custody.DeviceMemoryResource(0).allocate(SIZE, stream=stream)
    with pytest.raises(BufferError, match="ambiguous"):
        StridedMemoryView.from_dlpack(buf, stream_ptr=None)
    with pytest.raises(BufferError, match="stream=0"):
        buf.__dlpack__(stream=0)
    with pytest.raises(BufferError, match="stream"):
        buf.__dlpack__(stream=-2)
    buf.close()
    with pytest.raises(RuntimeError, match="closed"):
        StridedMemoryView.from_dlpack(buf, stream_ptr=stream.handle)
    with pytest.raises(RuntimeError, match="closed"):
        StridedMemoryView.from_cuda_array_interface(buf, stream_ptr=stream.handle)
    with pytest.raises(ValueError, match="strides must be divisible by itemsize"):
        StridedMemoryView.from_array_interface(np.zeros(3, dtype="i4,f8")["f1"])


class Producer:
    """A DLPack producer that hands over whatever ``capsule`` gives."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack_device__(self):
        return (int(custody.DLDeviceType.kDLCPU), 0)

    def __dlpack__(self, **kwargs):
        return self.capsule()


def test_a_producer_that_returns_no_tensor_is_refused():
    make = ctypes.pythonapi.PyCapsule_New
    make.restype, make.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    word = ctypes.c_uint64(0)
    with pytest.raises(BufferError, match="DLPack capsule"):
        StridedMemoryView.from_dlpack(Producer(lambda: make(ctypes.addressof(word), b"other", None)), -1)
    with pytest.raises(BufferError, match="DLPack capsule"):
        StridedMemoryView.from_dlpack(Producer(lambda: 5), -1)


class Versioned(ctypes.Structure):
    """DLPack's versioned tensor header: ``version``, ``manager_ctx``, ``deleter``."""

    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


def test_an_unsupported_dlpack_major_version_is_released_and_refused():
    deleted = []
    deleter_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    deleter = deleter_type(lambda p: deleted.append(p))
    tensor = Versioned(major=2, minor=0, manager_ctx=None,
                       deleter=ctypes.cast(deleter, ctypes.c_void_p).value)
    make = ctypes.pythonapi.PyCapsule_New
    make.restype, make.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    with pytest.raises(BufferError, match="major version 2"):
        StridedMemoryView.from_dlpack(
            Producer(lambda: make(ctypes.addressof(tensor), b"dltensor_versioned", None)), -1
        )
    assert deleted == [ctypes.addressof(tensor)], "the consumer released the tensor it refused"


# --- DLPack's C exchange table, driven as a C consumer (PyTorch's from_dlpack) would ---


class ExchangeApi(ctypes.Structure):
    """``DLPackExchangeAPI`` (DLPack 1.3): the header, then five function pointers."""

    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("prev_api", ctypes.c_void_p),
        ("allocator", ctypes.c_void_p),
        ("from_py_object", ctypes.c_void_p),
        ("to_py_object", ctypes.c_void_p),
        ("dltensor_from_py_object", ctypes.c_void_p),
        ("current_work_stream", ctypes.c_void_p),
    ]


def exchange_table():
    capsule = StridedMemoryView.__dlpack_c_exchange_api__
    assert StridedMemoryView.__c_dlpack_exchange_api__ is capsule
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return ExchangeApi.from_address(get(capsule, b"dlpack_exchange_api"))


def test_the_exchange_table_hands_a_views_tensor_over_and_back():
    table = exchange_table()
    assert (table.major, table.prev_api) == (1, None)
    assert table.dltensor_from_py_object is None, "the optional borrowed form is absent"
    from_object = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))(
        table.from_py_object
    )
    to_object = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))(
        table.to_py_object
    )
    array = np.arange(12, dtype=np.int16).reshape(3, 4)[:, ::2]
    alive = weakref.ref(array)
    view = StridedMemoryView.from_dlpack(array, stream_ptr=-1)
    tensor = ctypes.c_void_p()
    assert from_object(ctypes.c_void_p(id(view)), ctypes.byref(tensor)) == 0
    assert tensor.value
    out = ctypes.c_void_p()
    assert to_object(tensor, ctypes.byref(out)) == 0  # the tensor's ownership passes over
    again = ctypes.cast(out, ctypes.py_object).value
    ctypes.pythonapi.Py_DecRef(ctypes.py_object(again))  # the reference `out` carried
    assert isinstance(again, StridedMemoryView)
    assert (again.ptr, again.shape, again.strides, again.dtype) == (
        view.ptr, view.shape, view.strides, view.dtype,
    )
    assert np.array_equal(np.from_dlpack(again), array)
    del view, array
    gc.collect()
    assert alive() is not None, "the exchanged view keeps the producer"
    del again
    gc.collect()
    assert alive() is None, "released when the exchanged view went"


def test_the_exchange_table_refuses_to_allocate_and_names_no_stream():
    table = exchange_table()
    errors = []
    set_error_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p)
    set_error = set_error_type(lambda ctx, kind, message: errors.append((kind, message)))
    allocate = ctypes.CFUNCTYPE(
        ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
        set_error_type,
    )(table.allocator)
    out = ctypes.c_void_p(1)
    assert allocate(None, ctypes.byref(out), None, set_error) == -1
    assert out.value is None and errors[0][0] == b"NotImplementedError"
    stream = ctypes.c_void_p(1)
    current = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p))(
        table.current_work_stream
    )
    assert current(2, 0, ctypes.byref(stream)) == 0 and stream.value is None
    from_object = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))(
        table.from_py_object
    )
    no_dtype = object()
    with pytest.raises(AttributeError):  # an object with no __dlpack__: -1 with the exception
        from_object(ctypes.c_void_p(id(no_dtype)), ctypes.byref(out))
