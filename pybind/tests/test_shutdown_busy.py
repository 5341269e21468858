"""Shutdown under load, in subprocesses, added to ``test_shutdown.py``'s scenarios
(which cover live buffers, a Python memory resource, queued deferred cleanup, a failing free at
exit and an escalated warnings filter): the interpreter exits while the cleanup worker is busy
with thousands of queued frees and a daemon thread is inside a Python memory resource's
``deallocate``. Clean exit (status 0, no traceback, no Rust panic, no fatal error), no hang (a
120 s limit), repeated to catch a rare ordering; on the emulator, the child also checks that no
free it completed was unordered."""

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
