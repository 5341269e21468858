"""A Python memory resource's ``deallocate`` is never re-entered on a thread where one of its
calls is running (docs/decisions.md D10): a buffer released inside ``deallocate`` (its
last reference dropped, the cyclic garbage collector run, an explicit ``close()``) is freed right
after the running call returns, on the same thread, in its own recipe's context and on its own
stream; a failure of that nested free is reported as a ``CUDAWarning``.

The resource below holds a non-reentrant ``threading.Lock`` inside ``deallocate``, acquired with
a timeout, so that a re-entered call fails (and is recorded) instead of hanging the suite. The
same file runs on free-threaded CPython (``PYTHON_GIL=0``), where four threads drop buffers of
such a resource while garbage collections run inside ``deallocate``."""

from __future__ import annotations

import gc
import threading
import warnings

import custody
from conftest import cuda_warnings, current_context

LOCK_TIMEOUT_S = 5
JOIN_TIMEOUT_S = 120


class LockingResource(custody.MemoryResource):
    """Hands out device-pool memory; ``deallocate`` takes ``self.lock`` (non-reentrant) and,
    holding it, records the call, runs ``self.hook(ptr)`` and frees the backing pool buffer on
    the stream it was given. ``fail`` holds pointers whose deallocate raises."""

    def __init__(self):
        self.pool = custody.DeviceMemoryResource(0)
        self.lock = threading.Lock()
        self.backing = {}
        self.events = []
        self.failures = []
        self.fail = set()
        self.hook = None
        self.running = 0

    def allocate(self, size, *, stream):
        backing = self.pool.allocate(size, stream=stream)
        self.backing[backing.handle] = backing
        return custody.Buffer.from_handle(backing.handle, size, mr=self, stream=stream)

    def deallocate(self, ptr, size, *, stream):
        if not self.lock.acquire(timeout=LOCK_TIMEOUT_S):
            self.failures.append((ptr, threading.get_ident()))
            raise RuntimeError("deallocate re-entered (or stuck) while its lock is held")
        try:
            self.running += 1
            self.events.append(
                {
                    "ptr": ptr,
                    "thread": threading.get_ident(),
                    "running": self.running,
                    "context": current_context(),
                    "stream": stream.handle,
                }
            )
            backing = self.backing.pop(ptr)
            if self.hook is not None:
                self.hook(ptr)
            backing.close(stream=stream)
            if ptr in self.fail:
                raise ValueError(f"refused 0x{ptr:x}")
        finally:
            self.running -= 1
            self.lock.release()

    @property
    def is_device_accessible(self):
        return True

    @property
    def is_host_accessible(self):
        return False

    @property
    def device_id(self):
        return 0


def two_buffers(device):
    """A resource, an outer buffer on one created stream and an inner one on another."""
    mr = LockingResource()
    s_outer, s_inner = device.create_stream(), device.create_stream()
    outer = mr.allocate(64, stream=s_outer)
    inner = mr.allocate(64, stream=s_inner)
    return mr, outer, inner, s_outer, s_inner


def assert_nested_after_outer(mr, outer_ptr, inner_ptr, s_outer, s_inner, device):
    assert mr.failures == [], "deallocate was re-entered"
    assert [e["ptr"] for e in mr.events] == [outer_ptr, inner_ptr]
    assert [e["running"] for e in mr.events] == [1, 1], "the nested call ran inside the outer"
    assert len({e["thread"] for e in mr.events}) == 1
    assert {e["context"] for e in mr.events} == {device.context.handle}
    assert [e["stream"] for e in mr.events] == [s_outer.handle, s_inner.handle]
    assert mr.backing == {}


def test_last_reference_dropped_inside_deallocate(device, recorded_warnings):
    mr, outer, inner, s_outer, s_inner = two_buffers(device)
    o, i = outer.handle, inner.handle
    holder = [inner]
    del inner
    mr.hook = lambda ptr: holder.clear() if ptr == o else None
    outer.close()
    assert_nested_after_outer(mr, o, i, s_outer, s_inner, device)
    assert cuda_warnings(recorded_warnings) == []


def test_garbage_collection_inside_deallocate(device, recorded_warnings):
    mr, outer, inner, s_outer, s_inner = two_buffers(device)
    o, i = outer.handle, inner.handle
    cycle = [inner]
    cycle.append(cycle)  # garbage once dropped: only the collector frees `inner`
    del inner, cycle
    mr.hook = lambda ptr: gc.collect() if ptr == o else None
    holder = [outer]
    del outer
    holder.clear()  # the outer release is a drop too
    assert_nested_after_outer(mr, o, i, s_outer, s_inner, device)
    assert cuda_warnings(recorded_warnings) == []


def test_explicit_close_inside_deallocate_and_its_failure(device, recorded_warnings):
    """A nested explicit close returns at once (the buffer is closed); the free runs after the
    outer call, and its failure is a CUDAWarning naming the resource, the pointer and the
    exception (nobody is left to raise it to). The outer close is unaffected."""
    mr, outer, inner, s_outer, s_inner = two_buffers(device)
    o, i = outer.handle, inner.handle
    mr.fail.add(i)
    seen = []

    def hook(ptr):
        if ptr == o:
            inner.close()
            seen.append(inner.is_closed)

    mr.hook = hook
    outer.close()
    assert seen == [True]
    assert_nested_after_outer(mr, o, i, s_outer, s_inner, device)
    warned = [str(w.message) for w in cuda_warnings(recorded_warnings)]
    assert len(warned) == 1, warned
    assert f"LockingResource.deallocate(0x{i:x}" in warned[0] and "refused" in warned[0]


def test_outer_failure_still_raises_after_the_nested_free(device, recorded_warnings):
    """The explicit close whose own deallocate raised re-raises that exception, after the
    nested free it released ran."""
    mr, outer, inner, s_outer, s_inner = two_buffers(device)
    o, i = outer.handle, inner.handle
    mr.fail.add(o)
    holder = [inner]
    del inner
    mr.hook = lambda ptr: holder.clear() if ptr == o else None
    try:
        outer.close()
    except ValueError as error:
        assert f"refused 0x{o:x}" in str(error)
    else:
        raise AssertionError("the outer close did not raise")
    assert outer.is_closed
    assert_nested_after_outer(mr, o, i, s_outer, s_inner, device)
    assert cuda_warnings(recorded_warnings) == []


def test_four_threads_drop_buffers_while_deallocate_collects(device):
    """Four threads make garbage cycles holding buffers of one resource while its deallocate,
    holding its lock, runs the collector every few calls: every buffer is deallocated exactly
    once, never re-entrantly, and every thread finishes."""
    threads_n, per_thread = 4, 150
    mr = LockingResource()
    calls = [0]

    def hook(ptr):
        calls[0] += 1
        if calls[0] % 8 == 0:
            gc.collect()

    mr.hook = hook
    made = []
    errors = []

    def worker():
        try:
            device.set_current()
            s = device.create_stream()
            for _ in range(per_thread):
                b = mr.allocate(64, stream=s)
                made.append(1)
                junk = [b]
                junk.append(junk)
                del b, junk
            s.sync()
        except BaseException as error:  # noqa: BLE001 - asserted empty
            errors.append(repr(error))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=worker) for _ in range(threads_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(JOIN_TIMEOUT_S)
        hung = [t.name for t in threads if t.is_alive()]
        assert not hung, f"threads still running (deadlock?): {hung}"
        gc.collect()
        custody.drain_deferred_cleanup()
    assert errors == []
    assert mr.failures == [], mr.failures[:5]
    assert len(made) == threads_n * per_thread
    assert len(mr.events) == threads_n * per_thread
    assert all(e["running"] == 1 for e in mr.events)
    assert mr.backing == {}
    assert cuda_warnings(caught) == []


def test_a_nested_release_whose_context_cannot_be_read_is_reported_not_run_elsewhere(
    device, emu, recorded_warnings
):
    """A release inside a running ``deallocate`` queues its call with the
    context the release made current for it (its recipe's); when reading that context fails,
    the call is not run later in whatever context is current then (it was, the failure taken
    for "no context"): it is reported, naming the call, and the memory is leaked."""
    if emu is None:
        import pytest

        pytest.skip("needs the emulated driver's fault injection")
    from conftest import DRIVER
    import ctypes

    mr, outer, _, s_outer, _ = two_buffers(device)
    # The inner buffer's recipe: the legacy stream bound to a context of device 0 other than its
    # primary one (made by "other code"), so that a call run in the wrong context shows.
    other = ctypes.c_void_p()
    assert DRIVER.cuCtxCreate_v2(ctypes.byref(other), 0, 0) == 0
    inner = mr.allocate(64, stream=custody.LEGACY_DEFAULT_STREAM)
    device.set_current()
    o, i = outer.handle, inner.handle
    holder = [inner]
    del inner

    def hook(ptr):
        if ptr == o:
            # The nested release reads the current context once (cuCtxGetCurrent) to queue the
            # call, after making the recipe's current (one more read): fail the second.
            emu.inject_fault("cuCtxGetCurrent", 2, 201)  # CUDA_ERROR_INVALID_CONTEXT
            holder.clear()
            emu.clear_faults()

    mr.hook = hook
    outer.close()
    ran = [e for e in mr.events if e["ptr"] == i]
    assert ran == [] or ran[0]["context"] == other.value, "run in another context than its recipe's"
    warned = [str(w.message) for w in cuda_warnings(recorded_warnings)]
    assert any(f"LockingResource.deallocate(0x{i:x}" in w and "context" in w for w in warned), warned
    assert DRIVER.cuCtxDestroy_v2(other) == 0
    device.set_current()
