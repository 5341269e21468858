"""What the package tells a user who got something wrong: no driver to load, a stream passed
positionally where it is keyword-only, a subclass missing a method, and the reprs that show what
an object holds. Each message names the class the user called."""

import inspect
import os
import subprocess
import sys
import textwrap
import types

import pytest

import custody


def test_no_driver_names_the_variable_and_the_emulated_driver(tmp_path):
    missing = tmp_path / "no-driver-here" / "libcuda.so.1"
    script = textwrap.dedent(
        """
        import custody
        try:
            custody.system.num_devices
        except custody.CUDAError as error:
            print(type(error).__name__, error.name, error.code)
            print(error)
        else:
            print("no error")
        """
    )
    env = dict(os.environ, CUSTODY_CUDA_DRIVER=str(missing))
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    first, message = out.stdout.split("\n", 1)
    assert first == "CUDAError CUDA_ERROR_NOT_FOUND 500", out.stdout
    # What was tried, which variable names a driver, and how to get the emulated one.
    for part in (
        str(missing),
        "CUSTODY_CUDA_DRIVER",
        "libcuda_emu.so",
        "cargo build -p cuda-custody-emu",
    ):
        assert part in message, (part, message)


class Incomplete(custody.MemoryResource):
    """A subclass that defines nothing: the base class's errors name it."""


def keyword_only_calls(device, stream):
    """``(label, call, expected message)`` for every method whose ``stream`` is keyword-only,
    each called with ``stream`` in the next positional slot; the messages name the class the
    call went to, subclasses included."""
    pool = custody.DeviceMemoryResource(device)
    buf = pool.allocate(64, stream=stream)
    managed = custody.ManagedMemoryResource().allocate(64, stream=stream)
    other = pool.allocate(64, stream=stream)
    one = "1 positional argument but 2 were given"
    return [
        ("Buffer.fill", lambda: buf.fill(1, stream),
         f"Buffer.fill() takes {one}: stream is keyword-only (fill(value, stream=s))"),
        ("ManagedBuffer.fill", lambda: managed.fill(1, stream),
         f"ManagedBuffer.fill() takes {one}: stream is keyword-only (fill(value, stream=s))"),
        ("Buffer.copy_to", lambda: buf.copy_to(other, stream),
         "Buffer.copy_to() takes from 0 to 1 positional arguments but 2 were given: stream is "
         "keyword-only (copy_to(dst, stream=s))"),
        ("Buffer.copy_from", lambda: buf.copy_from(other, stream),
         f"Buffer.copy_from() takes {one}: stream is keyword-only (copy_from(src, stream=s))"),
        ("DeviceMemoryResource.allocate", lambda: pool.allocate(64, stream),
         f"DeviceMemoryResource.allocate() takes {one}: stream is keyword-only "
         "(allocate(size, stream=s))"),
        ("DeviceMemoryResource.deallocate", lambda: pool.deallocate(buf.handle, 64, stream),
         "DeviceMemoryResource.deallocate() takes 2 positional arguments but 3 were given: "
         "stream is keyword-only (deallocate(ptr, size, stream=s))"),
        ("Device.allocate", lambda: device.allocate(64, stream),
         f"Device.allocate() takes {one}: stream is keyword-only (allocate(size, stream=s))"),
        ("Buffer.from_handle", lambda: custody.Buffer.from_handle(buf.handle, 64, pool, None, stream),
         "Buffer.from_handle() takes from 2 to 4 positional arguments but 5 were given: stream "
         "is keyword-only (from_handle(ptr, size, mr, owner, stream=s))"),
        ("ManagedBuffer.from_handle",
         lambda: custody.ManagedBuffer.from_handle(managed.handle, 64, None, None, stream),
         "ManagedBuffer.from_handle() takes from 2 to 4 positional arguments but 5 were given: "
         "stream is keyword-only (from_handle(ptr, size, mr, owner, stream=s))"),
        ("Buffer.from_ipc_descriptor",
         lambda: custody.Buffer.from_ipc_descriptor(pool, bytes(96), stream),
         "Buffer.from_ipc_descriptor() takes 2 positional arguments but 3 were given: stream is "
         "keyword-only (from_ipc_descriptor(mr, ipc_descriptor, stream=s))"),
    ], (buf, managed, other)


def test_a_positional_stream_is_refused_as_keyword_only(device, stream, emu):
    calls, buffers = keyword_only_calls(device, stream)
    live = emu.live_ids() if emu is not None else None
    for label, call, message in calls:
        with pytest.raises(TypeError) as info:
            call()
        assert str(info.value) == message, label
    # Refused before anything ran: no allocation made or freed, every buffer still open.
    if emu is not None:
        assert emu.live_ids() == live
    for buf in buffers:
        assert not buf.is_closed
        buf.fill(2, stream=stream)
    stream.sync()
    for buf in buffers:
        buf.close()


def test_managed_placement_refuses_a_positional_stream_as_keyword_only(device, stream):
    """``prefetch``, ``discard`` and ``discard_prefetch`` take ``stream`` by keyword only too,
    with the same message (``discard`` takes no positional argument at all)."""
    buf = custody.LegacyManagedMemoryResource().allocate(64, stream=stream)
    for call, message in (
        (lambda: buf.prefetch(device, stream),
         "ManagedBuffer.prefetch() takes 1 positional argument but 2 were given: stream is "
         "keyword-only (prefetch(location, stream=s))"),
        (lambda: buf.discard(stream),
         "ManagedBuffer.discard() takes no positional arguments but 1 was given: stream is "
         "keyword-only (discard(stream=s))"),
        (lambda: buf.discard_prefetch(device, stream),
         "ManagedBuffer.discard_prefetch() takes 1 positional argument but 2 were given: "
         "stream is keyword-only (discard_prefetch(location, stream=s))"),
    ):
        with pytest.raises(TypeError) as info:
            call()
        assert str(info.value) == message
    assert not buf.is_closed
    buf.close()


def test_keyword_only_signatures_still_show_the_keyword(device, stream):
    """The methods collect a positional ``stream`` to name it, yet their signatures are the
    stub's (``test_stubs.py`` compares every one) or, for a Python method, its own."""
    for method, text in (
        (custody.Buffer.fill, "(self, /, value, *, stream)"),
        (custody.Buffer.copy_to, "(self, /, dst=None, *, stream)"),
        (custody.MemoryResource.deallocate, "(self, /, ptr, size, *, stream)"),
        (custody.Buffer.from_handle, "(ptr, size, mr=None, owner=None, *, stream=None)"),
        (custody.Device.allocate, "(self, size: 'int', *, stream: 'StreamLike') -> 'Buffer'"),
    ):
        assert str(inspect.signature(method)) == text


def test_a_missing_stream_is_still_required(device, stream):
    buf = custody.DeviceMemoryResource(device).allocate(64, stream=stream)
    for call in (lambda: buf.fill(1), lambda: buf.fill(1, stream=None), lambda: buf.copy_to()):
        with pytest.raises(TypeError, match="^stream is required and must not be None"):
            call()
    buf.close()


def test_base_class_errors_name_the_subclass(stream):
    mr = Incomplete()
    for call, what in (
        (lambda: mr.allocate(8, stream=stream), "allocate"),
        (lambda: mr.deallocate(1, 8, stream=stream), "deallocate"),
        (lambda: mr.device_id, "device_id"),
    ):
        with pytest.raises(TypeError) as info:
            call()
        assert str(info.value) == (
            f"Incomplete.{what} must be implemented: Incomplete subclasses MemoryResource "
            "without defining it"
        )


def test_pool_attributes_repr_names_every_attribute_and_its_value(device, stream):
    pool = custody.DeviceMemoryResource(device)
    buf = pool.allocate(4096, stream=stream)
    stream.sync()
    attributes = pool.attributes
    text = repr(attributes)
    names = sorted(
        name for name, value in vars(custody.MemoryPoolAttributes).items()
        if isinstance(value, types.GetSetDescriptorType)
    )
    assert len(names) == 8, names
    # `MemoryPoolAttributes(name=value, ...)`, values as Python writes them.
    assert text == "MemoryPoolAttributes(" + ", ".join(
        f"{name}={getattr(attributes, name)!r}" for name in names
    ) + ")"
    assert attributes.used_mem_current >= 4096
    buf.close()
