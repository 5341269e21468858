"""Shutdown under load, in subprocesses, added to ``test_shutdown.py``'s scenarios
(which cover live buffers, a Python memory resource, queued deferred cleanup, a failing free at
exit and an escalated warnings filter): the interpreter exits while the cleanup worker is busy
with thousands of queued frees and a daemon thread is inside a Python memory resource's
``deallocate``. Clean exit (status 0, no traceback, no Rust panic, no fatal error), no hang (a
120 s limit), repeated to catch a rare ordering; on the emulator, the child also checks that no
free it completed was unordered. Then daemon threads stopped by CPython at exit: inside Python
code that a custody call runs (a Python memory resource's properties) and while taking the GIL
back after a call that released it."""

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    sys.path.insert(0, {tests!r})
    import custody
    from conftest import EMU, RecordingResource

    dev = custody.Device(0)
    dev.set_current()
    s = dev.create_stream()

    class SlowMR(RecordingResource):
        def deallocate(self, ptr, size, *, stream):
            time.sleep(0.001)  # still inside deallocate when the interpreter goes
            super().deallocate(ptr, size, stream=stream)

    mr = SlowMR()
    inside = threading.Event()

    def churn():
        own = dev.create_stream()
        try:
            while True:
                b = mr.allocate(256, stream=own)
                inside.set()
                del b
        except BaseException:
            pass  # the interpreter is tearing down under this daemon thread

    threading.Thread(target=churn, daemon=True).start()
    inside.wait(30)
    kept = [mr.allocate(64, stream=s) for _ in range(8)]
    pinned = custody.LegacyPinnedMemoryResource()
    # Thousands of synchronous frees queued for the cleanup worker right before exit.
    for _ in range({frees}):
        pinned.allocate(4096, stream=s).fill(7, stream=s)
    managed = [custody.ManagedMemoryResource().allocate(4096, stream=s) for _ in range(64)]
    del managed
    if EMU is not None:
        assert EMU.hazards() == [], EMU.hazards()
    print("exiting", flush=True)
    """
)


@pytest.mark.parametrize("round", range(3))
def test_exit_with_a_busy_worker_and_a_deallocate_in_flight(round):
    script = SCRIPT.format(tests=os.path.dirname(__file__), frees=2000)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "exiting", out.stdout
    for bad in ("Traceback", "Fatal Python error", "panicked", "PanicException", "Segmentation"):
        assert bad not in out.stderr, out.stderr


PYTHON_BELOW = textwrap.dedent(
    """
    import sys, threading
    sys.path.insert(0, {tests!r})
    import custody
    from conftest import RecordingResource

    dev = custody.Device(0)
    dev.set_current()

    class BusyMR(RecordingResource):
        # Python code that custody runs below its own frames (Buffer.from_handle reads these
        # properties): long enough that the thread often gives up the GIL inside it.
        @property
        def is_device_accessible(self):
            return sum(range(1_000_000)) >= 0

        @property
        def is_host_accessible(self):
            return sum(range(1_000_000)) < 0

    started = [threading.Event() for _ in range({threads})]

    def churn(started):
        mr = BusyMR()
        own = dev.create_stream()
        ptr = mr.raw_allocate(256, own)
        try:
            while True:
                custody.Buffer.from_handle(ptr, 256, mr=mr, stream=own).close()
                ptr = mr.raw_allocate(256, own)
                started.set()
        except BaseException:
            pass  # the interpreter is tearing down under this daemon thread

    for flag in started:
        threading.Thread(target=churn, args=(flag,), daemon=True).start()
    for flag in started:
        assert flag.wait(30)

    # Freed by the interpreter's finalization (when the sys module's dictionary is cleared): the
    # GIL is released then, daemon threads waiting for it take it and are stopped by CPython,
    # while the main thread has work left.
    class Late:
        def __del__(self, pause=__import__("time").sleep):
            pause(0.2)

    sys.late = Late()
    print("exiting", flush=True)
    """
)


@pytest.mark.parametrize("round", range(8))
def test_exit_while_daemon_threads_run_python_code_below_custody_calls(round):
    """Daemon threads loop on ``Buffer.from_handle(..., mr=...)`` with a Python memory resource
    whose properties (read by custody during the call) run Python code, while the main thread
    exits. CPython 3.11 stops a daemon thread that takes the GIL once finalization has begun,
    with a forced unwind (``pthread_exit``); from inside those properties the unwind reached
    pyo3's ``catch_unwind`` and the process aborted (``FATAL: exception not rethrown``). Custody
    parks such a thread instead (pybind/DESIGN.md, "Shutdown"): a clean exit; stderr names only
    the frees through Python that the parked threads' buffers still owe."""
    script = PYTHON_BELOW.format(tests=os.path.dirname(__file__), threads=8)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "exiting", out.stdout
    for bad in ("Traceback", "Fatal", "FATAL", "panicked", "PanicException", "Segmentation"):
        assert bad not in out.stderr, out.stderr
    for line in out.stderr.splitlines():
        assert line.startswith("custody: CUDAWarning: BusyMR.deallocate(0x"), out.stderr


DETACHING = textwrap.dedent(
    """
    import sys, threading
    sys.path.insert(0, {tests!r})
    import custody

    dev = custody.Device(0)
    dev.set_current()
    pool = custody.DeviceMemoryResource(0)
    started = [threading.Event() for _ in range({threads})]

    def churn(started):
        own = dev.create_stream()
        event = own.record()
        try:
            while True:
                # Each call releases the GIL around its driver work and takes it back after.
                b = pool.allocate(256, stream=own)
                own.sync()
                event.is_done
                dev.sync()
                b.close()
                started.set()
        except BaseException:
            pass  # the interpreter is tearing down under this daemon thread

    for flag in started:
        threading.Thread(target=churn, args=(flag,), daemon=True).start()
    for flag in started:
        assert flag.wait(30)

    # As in PYTHON_BELOW: the finalization releases the GIL with work left.
    class Late:
        def __del__(self, pause=__import__("time").sleep):
            pause(0.2)

    sys.late = Late()
    print("exiting", flush=True)
    """
)


@pytest.mark.parametrize("round", range(2))
def test_exit_while_daemon_threads_are_inside_calls_that_release_the_gil(round):
    """Daemon threads loop on calls that release the GIL (an allocation, synchronizations, an
    event query) while the main thread exits: most are waiting to take the GIL back when
    finalization begins, and CPython 3.11 stops each with a forced unwind when it gets it. pyo3
    parks a thread stopped while it takes the GIL back (pybind/DESIGN.md, "Shutdown"), so that
    unwind never reaches a ``catch_unwind``: a clean exit with nothing on stderr."""
    script = DETACHING.format(tests=os.path.dirname(__file__), threads=8)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "exiting", out.stdout
    assert out.stderr == "", out.stderr
