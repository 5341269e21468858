"""Shared fixtures for custody's pytest suite.

The same files run against the emulated driver (``cargo xtask test`` sets ``CUSTODY_CUDA_DRIVER``
to ``libcuda_emu.so``) and against a real GPU. ``emu`` is the emulator's test interface (call
log, hazards, live allocations, fault injection), read with ctypes from the very library custody
loaded; it is ``None`` on a real driver, and tests keep only their observable assertions then
(warnings, errors, pool attributes, the current context).
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import json
import os
import signal
import sys
import threading
import warnings

import pytest

import custody

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_DEINITIALIZED = 4
CUDA_ERROR_INVALID_CONTEXT = 201


def pytest_configure(config: pytest.Config) -> None:
    # Registered here as well as in pyproject.toml: the GPU bundle runs these files without it.
    config.addinivalue_line(
        "markers",
        "expect_hazards(*kinds): the emulator's hazard checker must have seen exactly these "
        "hazards",
    )
    config.addinivalue_line(
        "markers",
        "own_process: the GPU runner runs this test in a pytest process of its own, under its "
        "per-test time limit and with its hang diagnostics",
    )


def pytest_sessionfinish(session, exitstatus) -> None:
    """Frees what deferred cleanup still holds before the process exits, so that a leak check
    (the GPU runner's compute-sanitizer mode) sees only what the tests left allocated."""
    custody.drain_deferred_cleanup()
    gc.collect()
    custody.drain_deferred_cleanup()


def dump_stacks_on_signal() -> None:
    """Makes SIGUSR2 write every thread's Python stack to the process's real stderr: the GPU
    runner sends it to a test process it is about to kill for running too long (docs/testing.md,
    "When a test hangs"), and a test sends it to a child process that stopped answering. Child
    processes that import a test module get it from this module's import."""
    if sys.__stderr__ is not None:
        faulthandler.register(signal.SIGUSR2, file=sys.__stderr__, all_threads=True, chain=False)


dump_stacks_on_signal()


def _driver_library() -> ctypes.CDLL:
    path = os.environ.get("CUSTODY_CUDA_DRIVER") or "libcuda.so.1"
    return ctypes.CDLL(path)


DRIVER = _driver_library()
DRIVER.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
DRIVER.cuCtxGetCurrent.restype = ctypes.c_int
DRIVER.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
DRIVER.cuCtxSetCurrent.restype = ctypes.c_int


def current_context() -> int:
    """The raw CUcontext current on the calling thread (0 for none), straight from the driver."""
    ctx = ctypes.c_void_p()
    status = DRIVER.cuCtxGetCurrent(ctypes.byref(ctx))
    if status == 3:  # CUDA_ERROR_NOT_INITIALIZED: no context either
        return 0
    assert status == 0, f"cuCtxGetCurrent returned {status}"
    return ctx.value or 0


def clear_current() -> None:
    """Unbinds whatever context is current on the calling thread."""
    assert DRIVER.cuCtxSetCurrent(None) == 0


class Emulator:
    """The emulated driver's test interface (cuda-sys/src/emu.rs documents the C symbols)."""

    def __init__(self, lib: ctypes.CDLL):
        self._lib = lib
        lib.custodyEmuQuery.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.custodyEmuQuery.restype = ctypes.c_size_t
        lib.custodyEmuClear.argtypes = [ctypes.c_char_p]
        lib.custodyEmuClear.restype = None
        lib.custodyEmuInjectFault.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_int]
        lib.custodyEmuInjectFault.restype = ctypes.c_int
        lib.custodyEmuClearFaults.argtypes = []
        lib.custodyEmuClearFaults.restype = None
        lib.custodyEmuThreadId.argtypes = []
        lib.custodyEmuThreadId.restype = ctypes.c_ulonglong
        lib.custodyEmuReuseStreamHandle.argtypes = [ctypes.c_ulonglong]
        lib.custodyEmuReuseStreamHandle.restype = ctypes.c_int

    def _query(self, what: str):
        name = what.encode()
        size = self._lib.custodyEmuQuery(name, None, 0)
        while True:
            buf = ctypes.create_string_buffer(size + 1)
            written = self._lib.custodyEmuQuery(name, buf, size + 1)
            if written <= size:
                return json.loads(buf.value.decode())
            # The record grew between the two queries (another thread's driver calls, such as
            # the cleanup worker's): nothing was written; ask again with room for it.
            size = written

    def calls(self):
        return self._query("calls")

    def hazards(self):
        return self._query("hazards")

    def allocations(self):
        return self._query("allocations")

    def live_pointers(self) -> set:
        """The addresses live now. Not an identity across time (a pool hands a freed address out
        again): to follow an allocation, use ``alloc_id`` and ``is_live``."""
        return {a["ptr"] for a in self.allocations()}

    def alloc_id(self, ptr: int) -> int:
        """The identity of the live allocation at ``ptr``. Take it while the allocation is live
        and follow the allocation by it: a pool hands a freed address out again
        (docs/driver-facts.md F18), so an address alone does not say which allocation it was."""
        (alloc,) = [a["id"] for a in self.allocations() if a["ptr"] == ptr]
        return alloc

    def live_ids(self) -> set:
        """The identities of every live allocation (compare these, not addresses, across time)."""
        return {a["id"] for a in self.allocations()}

    def is_live(self, alloc: int) -> bool:
        """Whether the allocation with identity ``alloc`` (see ``alloc_id``) is still live."""
        return any(a["id"] == alloc for a in self.allocations())

    def clear_calls(self) -> None:
        self._lib.custodyEmuClear(b"calls")

    def clear_hazards(self) -> None:
        self._lib.custodyEmuClear(b"hazards")

    def inject_fault(self, function: str, nth: int, error: int) -> None:
        assert self._lib.custodyEmuInjectFault(function.encode(), nth, error) == 0, function

    def clear_faults(self) -> None:
        self._lib.custodyEmuClearFaults()

    def thread_id(self) -> int:
        return self._lib.custodyEmuThreadId()

    def reuse_stream_handle(self, handle: int) -> bool:
        """The next stream created takes ``handle``, a destroyed stream's (a new stream under
        the old value, as a real driver may hand it out again)."""
        return self._lib.custodyEmuReuseStreamHandle(handle) == 0

    def calls_to(self, function: str, ptr: "int | None" = None, *, alloc: "int | None" = None):
        """Calls of ``function``; with ``alloc``, only those that made or freed that allocation
        (its identity, ``alloc_id``); with ``ptr``, only those whose pointer argument was
        ``ptr`` (which says nothing about which allocation was there)."""
        return [
            c
            for c in self.calls()
            if c["function"] == function
            and (ptr is None or c["ptr"] == ptr)
            and (alloc is None or c.get("alloc") == alloc)
        ]


def _emulator():
    try:
        version = DRIVER.custodyEmuVersion
    except AttributeError:
        return None
    version.restype = ctypes.c_int
    return Emulator(DRIVER) if version() == 1 else None


EMU = _emulator()

needs_emulator = pytest.mark.skipif(
    EMU is None, reason="needs the emulated driver's call log / fault injection"
)
needs_two_devices = pytest.mark.skipif(
    custody.system.num_devices < 2, reason="needs two CUDA devices"
)


@pytest.fixture
def emu():
    """The emulator's interface (None on a real driver), with faults and hazards cleared."""
    if EMU is not None:
        EMU.clear_faults()
        EMU.clear_hazards()
        EMU.clear_calls()
    yield EMU
    if EMU is not None:
        EMU.clear_faults()


@pytest.fixture
def device():
    """Device 0, its primary context current on the test's thread (restored afterwards)."""
    before = current_context()
    dev = custody.Device(0)
    dev.set_current()
    yield dev
    custody.drain_deferred_cleanup()
    gc.collect()
    if before:
        DRIVER.cuCtxSetCurrent(ctypes.c_void_p(before))
    else:
        dev.set_current()


@pytest.fixture
def stream(device):
    """A created stream on device 0, closed afterwards."""
    s = device.create_stream()
    yield s
    s.close()


@pytest.fixture(autouse=True)
def no_hazards(request):
    """Every test: fails if the emulator's hazard checker saw anything (an unordered free, a
    use after free, a double free, a free on a destroyed stream), unless the test is marked
    ``expect_hazards(kind, ...)``: then exactly those hazards must have been seen."""
    if EMU is not None:
        EMU.clear_hazards()
    yield EMU
    if EMU is not None:
        custody.drain_deferred_cleanup()
        gc.collect()
        marker = request.node.get_closest_marker("expect_hazards")
        expected = list(marker.args) if marker else []
        assert [h["kind"] for h in EMU.hazards()] == expected, EMU.hazards()


def drain_until(predicate, limit_s: float = 30.0) -> bool:
    """Drains deferred cleanup until predicate() holds, for at most limit_s seconds. A real
    driver may run a graph's user-object destructor later, on its own thread (docs/driver-facts.md
    G1), so what a destroyed graph retained is queued only eventually. Not a timing assertion: the
    caller asserts the predicate, the limit only bounds a hang."""
    import time

    deadline = time.monotonic() + limit_s
    while True:
        custody.drain_deferred_cleanup()
        gc.collect()
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)


def run_in_thread(fn, *args):
    """Runs fn on a fresh thread (which has no current context) and returns its result or
    re-raises its exception. The thread ends when fn returns: fn must leave nothing pending on
    its per-thread default stream (a real driver holds the thread's exit until that work has
    run, for minutes beside other processes: docs/driver-facts.md F24); a thread whose
    per-thread work must stay pending while the test goes on is ``run_in_parked_thread``'s."""
    result = {}

    def target():
        try:
            result["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller
            result["error"] = exc

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]
    return result.get("value")


class ParkedThread:
    """The thread of ``run_in_parked_thread``, alive until ``finish()``."""

    def __init__(self, thread, release):
        self._thread, self._release = thread, release

    def finish(self, timeout: float = 60.0) -> None:
        """Lets the thread synchronise its per-thread default stream and end, and joins it."""
        self._release.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the parked thread did not end"


def run_in_parked_thread(device, fn, *args):
    """Runs fn on a fresh thread and returns (its result, a ``ParkedThread``): the thread stays
    alive until ``finish()``, then makes ``device`` current, synchronises its per-thread default
    stream and ends, so that it never ends with per-thread work pending (docs/driver-facts.md
    F24) while the test frees what it recorded there from another thread. Re-raises fn's
    exception."""
    result, release, ready = {}, threading.Event(), threading.Event()

    def target():
        try:
            result["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller
            result["error"] = exc
        ready.set()
        release.wait()
        device.set_current()
        custody.PER_THREAD_DEFAULT_STREAM.sync()

    t = threading.Thread(target=target)
    t.start()
    ready.wait()
    parked = ParkedThread(t, release)
    if "error" in result:
        parked.finish()
        raise result["error"]
    return result["value"], parked


class RecordingResource(custody.MemoryResource):
    """A Python memory resource that hands out device-pool memory and records each
    ``deallocate``: pointer, size, stream handle, the context current during the call (read from
    the driver) and the calling thread. ``fail`` makes ``deallocate`` raise it instead."""

    def __init__(self, device_id: int = 0, fail: "BaseException | None" = None):
        self._pool = custody.DeviceMemoryResource(device_id)
        self.device = device_id
        self.fail = fail
        self.calls = []
        self.live = {}
        self.lock = threading.Lock()

    def raw_allocate(self, size, stream):
        """A pointer this resource owns (backed by a pool buffer it keeps)."""
        buf = self._pool.allocate(size, stream=stream)
        with self.lock:
            self.live[buf.handle] = buf
        return buf.handle

    def allocate(self, size, *, stream):
        ptr = self.raw_allocate(size, stream)
        return custody.Buffer.from_handle(ptr, size, mr=self, stream=stream)

    def deallocate(self, ptr, size, *, stream):
        with self.lock:
            self.calls.append(
                {
                    "ptr": ptr,
                    "size": size,
                    "stream": stream.handle,
                    "stream_obj": stream,
                    "context": current_context(),
                    "thread": threading.get_ident(),
                }
            )
        if self.fail is not None:
            raise self.fail
        with self.lock:
            backing = self.live.pop(ptr)
        backing.close(stream=stream)

    def release_all(self):
        with self.lock:
            live, self.live = self.live, {}
        for buf in live.values():
            buf.close()

    @property
    def is_device_accessible(self):
        return True

    @property
    def is_host_accessible(self):
        return False

    @property
    def device_id(self):
        return self.device


@pytest.fixture
def recorded_warnings():
    """Every warning (any thread) during the test, with filters reset to "always"."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def cuda_warnings(caught):
    return [w for w in caught if issubclass(w.category, custody.CUDAWarning)]
