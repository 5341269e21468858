"""Host-only memory resources and lazily read properties (docs/decisions.md D5;
docs/reference-notes.md section 5, scenario 6, and section 6 item 8):

- a resource whose ``is_device_accessible`` is False owns memory no device work can touch, so
  custody records no deallocation recipe for it: ``Buffer.from_handle(ptr, n, mr=host_mr)``
  needs no context (even in a process that never initialised CUDA), ``deallocate`` receives
  ``default_stream()`` with no context made current, and a ``stream`` given to ``from_handle``,
  ``set_deallocation_stream`` or ``close`` is checked and then has nothing to order;
- a Python resource's ``device_id`` is read only when asked (``Buffer.device_id``), so a
  resource whose ``device_id`` raises can still adopt memory."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

import custody
from conftest import RecordingResource, current_context, run_in_thread


class HostResource(custody.MemoryResource):
    """Host memory from ctypes; ``deallocate`` records what it was given."""

    def __init__(self):
        self.calls = []
        self.blocks = {}

    def allocate(self, size, *, stream):
        block = ctypes.create_string_buffer(size)
        ptr = ctypes.addressof(block)
        self.blocks[ptr] = block
        return custody.Buffer.from_handle(ptr, size, mr=self, stream=stream)

    def deallocate(self, ptr, size, *, stream):
        self.calls.append(
            {
                "ptr": ptr,
                "size": size,
                "default": stream is custody.default_stream(),
                "stream": stream.handle,
                "context": current_context(),
            }
        )
        del self.blocks[ptr]

    is_device_accessible = property(lambda self: False)
    is_host_accessible = property(lambda self: True)

    @property
    def device_id(self):
        raise RuntimeError("a host resource belongs to no device")


def host_block(mr, size=64):
    block = ctypes.create_string_buffer(size)
    ptr = ctypes.addressof(block)
    mr.blocks[ptr] = block
    return ptr


def test_host_only_resource_needs_no_context_and_gets_the_default_stream(device, stream):
    """On a thread with no context: adoption without a stream works; close and drop call
    deallocate with default_stream(), no context current; a given stream has nothing to order
    and is not passed on."""
    mr = HostResource()

    def on_thread():
        assert current_context() == 0
        closed = custody.Buffer.from_handle(host_block(mr), 64, mr=mr)
        assert closed.is_host_accessible and not closed.is_device_accessible
        closed.close()
        dropped = custody.Buffer.from_handle(host_block(mr), 32, mr=mr)
        del dropped
        with_stream = custody.Buffer.from_handle(host_block(mr), 16, mr=mr, stream=stream)
        with_stream.set_deallocation_stream(custody.LEGACY_DEFAULT_STREAM)  # no context needed
        with_stream.close(stream=custody.PER_THREAD_DEFAULT_STREAM)
        return current_context()

    assert run_in_thread(on_thread) == 0
    assert [c["size"] for c in mr.calls] == [64, 32, 16]
    for call in mr.calls:
        assert call["default"] and call["stream"] == custody.default_stream().handle, call
        assert call["context"] == 0, "a context was made current for host-only memory"
    assert mr.blocks == {}


def test_bad_streams_are_still_refused_for_host_only_memory(device):
    mr = HostResource()
    ptr = host_block(mr)
    with pytest.raises(TypeError):
        custody.Buffer.from_handle(ptr, 64, mr=mr, stream=object())
    buf = custody.Buffer.from_handle(ptr, 64, mr=mr)
    with pytest.raises(TypeError):
        buf.set_deallocation_stream(None)
    s = device.create_stream()
    s.close()
    with pytest.raises(RuntimeError, match="closed"):
        buf.close(stream=s)
    assert not buf.is_closed and mr.calls == []
    buf.close()
    assert len(mr.calls) == 1
    with pytest.raises(RuntimeError, match="closed"):
        buf.set_deallocation_stream(custody.LEGACY_DEFAULT_STREAM)


def test_never_initialised_process_adopts_host_memory(tmp_path):
    """A process that never initialised CUDA adopts host memory with a host-only resource and
    frees it through deallocate, and CUDA is still not initialised afterwards."""
    # Standalone: conftest asks the driver for its device count at import, which initialises it.
    script = textwrap.dedent(
        """
        import ctypes, os
        import custody

        driver = ctypes.CDLL(os.environ.get("CUSTODY_CUDA_DRIVER") or "libcuda.so.1")
        driver.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]

        def initialised():
            ctx = ctypes.c_void_p()
            status = driver.cuCtxGetCurrent(ctypes.byref(ctx))
            assert status in (0, 3), status  # 3: CUDA_ERROR_NOT_INITIALIZED
            return status == 0

        class HostMR(custody.MemoryResource):
            def __init__(self):
                self.calls, self.blocks = [], {}
            def deallocate(self, ptr, size, *, stream):
                self.calls.append((size, stream is custody.default_stream()))
                del self.blocks[ptr]
            is_device_accessible = property(lambda self: False)
            is_host_accessible = property(lambda self: True)
            device_id = property(lambda self: -1)

        def block(mr, size):
            b = ctypes.create_string_buffer(size)
            mr.blocks[ctypes.addressof(b)] = b
            return ctypes.addressof(b)

        assert not initialised(), "CUDA was initialised before the test began"
        mr = HostMR()
        buf = custody.Buffer.from_handle(block(mr, 64), 64, mr=mr)
        assert buf.is_host_accessible and not buf.is_device_accessible
        buf.close()
        other = custody.Buffer.from_handle(block(mr, 8), 8, mr=mr)
        del other
        assert mr.calls == [(64, True), (8, True)], mr.calls
        assert not initialised(), "custody initialised CUDA for host-only memory"
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_device_id_is_read_only_when_asked(device, stream):
    """A device resource whose device_id property raises still adopts memory; Buffer.device_id
    raises that error when asked; the free is unaffected."""

    class NoDeviceId(RecordingResource):
        reads = 0

        @property
        def device_id(self):
            NoDeviceId.reads += 1
            raise LookupError("device_id is not known yet")

    mr = NoDeviceId()
    buf = mr.allocate(64, stream=stream)
    assert NoDeviceId.reads == 0, "device_id was read at adoption"
    assert buf.is_device_accessible
    with pytest.raises(LookupError, match="not known yet"):
        buf.device_id
    assert NoDeviceId.reads == 1
    buf.close()
    assert len(mr.calls) == 1 and mr.calls[0]["stream"] == stream.handle


def test_device_id_of_a_python_resource_buffer_follows_the_resource(device, stream):
    mr = RecordingResource()
    buf = mr.allocate(64, stream=stream)
    assert buf.device_id == 0
    mr.device = 7  # the resource changed its mind: the buffer asks it each time
    assert buf.device_id == 7
    buf.close()
    host = HostResource()
    hbuf = custody.Buffer.from_handle(host_block(host), 8, mr=host)
    with pytest.raises(RuntimeError, match="no device"):
        hbuf.device_id
    hbuf.close()
