"""IPC between two processes: an IPC-enabled pool exported as a file descriptor, a buffer's
descriptor, the import in a child process ordered on a given stream (docs/reference-notes.md section
5, scenarios 59, 60, 65)."""

import os
import pickle
import subprocess
import sys
import textwrap

import pytest

import custody

CHILD = textwrap.dedent(
    """
    import ctypes, sys
    sys.path.insert(0, sys.argv[3])
    import custody
    from conftest import EMU
    fd, descriptor = int(sys.argv[1]), bytes.fromhex(sys.argv[2])
    dev = custody.Device(0)
    dev.set_current()
    s = dev.create_stream()
    mr = custody.DeviceMemoryResource.from_allocation_handle(0, fd)
    assert mr.is_mapped and mr.is_ipc_enabled
    for bad in (None,):
        try:
            custody.Buffer.from_ipc_descriptor(mr, descriptor, stream=bad)
        except TypeError:
            pass
        else:
            raise AssertionError("stream=None accepted")
    try:
        mr.allocate(64, stream=s)
    except TypeError as e:
        assert str(e) == "Cannot allocate from a mapped IPC-enabled memory resource", e
    else:
        raise AssertionError("a mapped pool allocated")
    buf = custody.Buffer.from_ipc_descriptor(mr, custody.IPCBufferDescriptor.from_bytes(descriptor), stream=s)
    assert buf.is_mapped and "is_mapped=True" in repr(buf)
    staging = custody.LegacyPinnedMemoryResource().allocate(buf.size, stream=s)
    staging.copy_from(buf, stream=s)
    s.sync()
    data = ctypes.string_at(staging.handle, buf.size)
    ptr = buf.handle
    alloc = EMU.alloc_id(ptr) if EMU else None
    staging.close()
    buf.close()
    if EMU is not None:
        (free,) = EMU.calls_to("cuMemFreeAsync", alloc=alloc)
        assert free["stream"] == s.handle and free["result"] == 0, free
        # close() of an import returns once the unmap has run (the exporter may free then).
        calls = EMU.calls()
        at = calls.index(free)
        assert any(c["function"] == "cuStreamSynchronize" and c["stream"] == s.handle
                   for c in calls[at + 1:]), "close() did not wait for the unmap"
        assert EMU.hazards() == [], EMU.hazards()
    print(data.hex())
    """
)


def test_buffer_shared_with_a_child_process(device, stream):
    """59: export, import in another process with stream=s, read the bytes, free on s."""
    options = custody.DeviceMemoryResourceOptions(ipc_enabled=True)
    mr = custody.DeviceMemoryResource(0, options)
    assert mr.is_ipc_enabled and not mr.is_mapped
    buf = mr.allocate(4096, stream=stream)
    buf.fill(0xA7, stream=stream)
    stream.sync()
    descriptor = buf.ipc_descriptor
    assert descriptor.size == 4096 and descriptor.device_id == 0
    assert pickle.loads(pickle.dumps(descriptor)) == descriptor
    handle = mr.get_allocation_handle()
    assert isinstance(handle, custody.IPCAllocationHandle) and handle.uuid == mr.uuid
    fd = handle.handle
    try:
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                CHILD,
                str(fd),
                bytes(descriptor).hex(),
                os.path.dirname(__file__),
            ],
            pass_fds=[fd],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        handle.close()
    assert handle.is_closed
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "a7" * 4096
    buf.close()


def test_imported_buffers_cannot_be_exported_again_and_views_cannot_export(device, stream):
    """65 (custody's rules): ipc_descriptor of a non-IPC buffer is a RuntimeError."""
    mr = custody.DeviceMemoryResource(0)
    buf = mr.allocate(64, stream=stream)
    with pytest.raises(RuntimeError, match="ipc-enabled"):
        buf.ipc_descriptor
    view = custody.Buffer.from_handle(buf.handle, 64)
    with pytest.raises(RuntimeError):
        view.ipc_descriptor
    buf.close()
