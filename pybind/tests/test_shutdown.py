"""Interpreter shutdown, in subprocesses: live buffers, a Python memory resource, queued deferred
cleanup and a failing free at exit give a clean exit, no hang, and (for the failure, and for
each free through Python that finalization makes impossible) one line on stderr; an ``atexit``
handler registered before ``import custody`` still frees through Python
(docs/reference-notes.md section 5, scenarios 58, 72; docs/decisions.md D3, D7)."""

import os
import subprocess
import sys
import textwrap

from conftest import EMU

PROLOGUE = textwrap.dedent(
    """
    import gc, sys, threading
    sys.path.insert(0, {tests!r})
    import custody
    from conftest import EMU, RecordingResource

    dev = custody.Device(0)
    dev.set_current()
    s = dev.create_stream()
    pool = custody.DeviceMemoryResource(0)
    """
)


def run_child(body: str, tmp_path, extra_args=()):
    """Runs PROLOGUE + body in a fresh interpreter (with the tests folder on sys.path, for
    conftest's helpers); a hang fails the test after 120 s."""
    script = PROLOGUE.format(tests=os.path.dirname(__file__)) + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, *extra_args, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_exit_with_live_buffers_resource_and_queued_cleanup(tmp_path):
    marker = tmp_path / "deallocated"
    out = run_child(
        f"""
        class FileMR(RecordingResource):
            def deallocate(self, ptr, size, *, stream):
                with open({str(marker)!r}, "a") as f:
                    f.write(hex(ptr) + "\\n")
                super().deallocate(ptr, size, stream=stream)

        mr = FileMR()
        kept_python = [mr.allocate(64, stream=s) for _ in range(4)]
        kept_pool = [pool.allocate(256, stream=s) for _ in range(4)]
        kept_pinned = custody.LegacyPinnedMemoryResource().allocate(64, stream=s)
        # Queue synchronous frees for the cleanup worker right before exit.
        pinned = [custody.LegacyPinnedMemoryResource().allocate(4096, stream=s) for _ in range(64)]
        del pinned
        # A daemon thread still dropping buffers while the interpreter exits.
        def churn(allocate=pool.allocate, legacy=custody.LEGACY_DEFAULT_STREAM):
            try:
                while True:
                    b = allocate(64, stream=legacy)
                    del b
            except BaseException:
                pass  # the interpreter is tearing down under this daemon thread
        threading.Thread(target=churn, daemon=True).start()
        done = mr.allocate(64, stream=s)
        del done  # freed now, before exit: deallocate runs once
        print("exiting")
        """,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "exiting"
    assert "Traceback" not in out.stderr and "Fatal" not in out.stderr, out.stderr
    lines = marker.read_text().split()
    assert len(lines) == 1, "deallocate ran once before exit, never during finalization"


def test_a_buffer_a_daemon_thread_keeps_alive_at_exit_is_reported(tmp_path):
    """A daemon thread still allocating when the interpreter exits keeps this module's globals
    alive (its frame holds them, and CPython never clears them then), so the finalization never
    frees a Python memory resource's buffer held there: its skipped free is still named on
    stderr, once, by the report at the end of the interpreter's shutdown."""
    out = run_child(
        """
        mr = RecordingResource()
        leaked = mr.allocate(64, stream=s)
        print(hex(leaked.handle), flush=True)
        started = threading.Event()

        def churn():
            try:
                while True:
                    b = pool.allocate(64, stream=s)
                    started.set()
                    del b
            except BaseException:
                pass  # the interpreter is tearing down under this daemon thread

        threading.Thread(target=churn, daemon=True).start()
        assert started.wait(30)
        """,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    leaked = out.stdout.strip()
    lines = [l for l in out.stderr.splitlines() if f"RecordingResource.deallocate({leaked}, 64)" in l]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("custody: CUDAWarning: ") and "was not called" in lines[0], lines
    assert "shutting down" in lines[0] and "leaked" in lines[0], lines
    assert "Traceback" not in out.stderr and "Fatal" not in out.stderr, out.stderr


def test_a_buffer_closed_during_a_capture_still_running_at_exit_is_reported_as_held_by_it(
    tmp_path,
):
    """A Python memory resource's buffer closed while its stream was being
    captured belongs to the capture's graph; exiting mid-capture, its skipped free is named as
    still held by a graph or capture, not as held by "something the interpreter never freed,
    such as a daemon thread's frame"."""
    out = run_child(
        """
        mr = RecordingResource()
        buf = mr.allocate(64, stream=s)
        print(hex(buf.handle), flush=True)
        s.sync()
        gb = s.create_graph_builder().begin_building()
        buf.close()  # the capture's graph takes the memory
        # The builder is never freed (one reference leaked), so the capture is still running
        # when the interpreter has finished shutting down.
        import ctypes
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(gb))
        """,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    ptr = out.stdout.strip()
    lines = [l for l in out.stderr.splitlines() if f"RecordingResource.deallocate({ptr}, 64)" in l]
    assert len(lines) == 1, out.stderr
    assert "was not called" in lines[0] and "leaked" in lines[0], lines
    assert "stream capture" in lines[0] and "its Buffer was closed" in lines[0], lines
    assert "daemon thread" not in lines[0], lines


def test_failing_free_at_exit_goes_to_stderr(tmp_path):
    if EMU is None:
        import pytest

        pytest.skip("needs the emulated driver's fault injection")
    out = run_child(
        """
        doomed = pool.allocate(64, stream=s)
        EMU.inject_fault("cuMemFreeAsync", 1, 1)
        print(hex(doomed.handle))
        """,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    ptr = out.stdout.strip()
    lines = [l for l in out.stderr.splitlines() if "CUDAWarning" in l]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("custody: CUDAWarning: cuMemFreeAsync(" + ptr + ")"), lines


def test_a_report_to_a_broken_stderr_does_not_panic(tmp_path):
    """A report that goes to stderr (the interpreter is exiting, on a thread
    other than its exit thread) when stderr cannot be written (a pipe nobody reads) is dropped,
    never a panic: ``eprintln!`` panicked there, inside a hook documented never to panic, and
    the panic came out of the buffer's deallocation as a ``PanicException``."""
    if EMU is None:
        import pytest

        pytest.skip("needs the emulated driver's fault injection")
    marker = tmp_path / "unraisable"
    body = f"""
        import atexit, os
        held = [pool.allocate(64, stream=s)]

        def hook(unraisable):
            with open({str(marker)!r}, "a") as f:
                f.write(type(unraisable.exc_value).__name__ + "\\n")

        def drop_on_another_thread():
            # custody's atexit callback has run: a thread other than the exit thread reports
            # to stderr.
            EMU.inject_fault("cuMemFreeAsync", 1, 1)
            del held[0]

        def late():
            t = threading.Thread(target=drop_on_another_thread)
            t.start()
            t.join()

        sys.unraisablehook = hook
        r, w = os.pipe()
        os.close(r)
        os.dup2(w, 2)  # stderr: a pipe nobody reads (writes fail with EPIPE)
        print("ok", flush=True)
        """
    # Registered before custody's own callback runs (atexit runs the last registered first):
    # `late` runs after it, so custody's exit has begun.
    script = (
        "import atexit\n"
        "_late = []\n"
        "atexit.register(lambda: _late and _late[0]())\n"
        + PROLOGUE.format(tests=os.path.dirname(__file__))
        + textwrap.dedent(body)
        + "_late.append(late)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    assert not marker.exists() or marker.read_text() == "", marker.read_text()


def test_escalated_warnings_filter_at_exit_is_harmless(tmp_path):
    out = run_child(
        """
        import warnings
        warnings.simplefilter("error", custody.CUDAWarning)
        kept = [pool.allocate(64, stream=s) for _ in range(8)]
        ptds = pool.allocate(64, stream=custody.PER_THREAD_DEFAULT_STREAM)
        print("ok")
        """,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    assert "Traceback" not in out.stderr, out.stderr


def test_drain_before_exit_frees_everything(tmp_path):
    out = run_child(
        """
        pinned = [custody.LegacyPinnedMemoryResource().allocate(4096, stream=s) for _ in range(16)]
        allocs = {EMU.alloc_id(b.handle) for b in pinned} if EMU is not None else set()
        del pinned
        custody.drain_deferred_cleanup()
        if EMU is not None:
            assert not (allocs & EMU.live_ids())
            assert EMU.hazards() == []
        print("ok")
        """,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


ATEXIT_FIRST = textwrap.dedent(
    """
    import atexit, gc, sys

    def late():
        # Registered before custody was imported, so it runs after custody's own atexit
        # callback: the interpreter is still fully alive, and Python deallocates still run.
        buf.close()
        print("closed", buf.is_closed, len(mr.calls), flush=True)
        global dropped
        del dropped
        gc.collect()
        print("dropped", len(mr.calls), flush=True)
        # Native frees run too: the handles crate stops calling the driver only at the C
        # library's exit, after the interpreter has finalized.
        native_ptr = native.handle
        native.close()
        print("native", EMU is None or native_ptr not in EMU.live_pointers(), flush=True)

    atexit.register(late)

    sys.path.insert(0, {tests!r})
    import custody
    from conftest import EMU, RecordingResource

    dev = custody.Device(0)
    dev.set_current()
    s = dev.create_stream()
    native = custody.DeviceMemoryResource(0).allocate(64, stream=s)
    mr = RecordingResource()
    buf = mr.allocate(64, stream=s)
    dropped = mr.allocate(64, stream=s)
    # Still alive when the interpreter finalizes: its deallocate cannot run then, and the
    # skipped free is reported on stderr.
    leaked = mr.allocate(64, stream=s)
    print("leaked", hex(leaked.handle), flush=True)

    # Kept in a cycle through this module's globals (MainMR.deallocate refers to them, and the
    # buffers' resource holds the class): only the collector, at finalization, finds them;
    # their skipped frees are reported too.
    class MainMR(RecordingResource):
        def deallocate(self, ptr, size, *, stream):
            assert gc is not None
            super().deallocate(ptr, size, stream=stream)

    kept = [MainMR().allocate(32, stream=s) for _ in range(3)]
    """
)


def test_atexit_handler_registered_before_import_still_frees(tmp_path):
    """An atexit handler registered before ``import custody`` closes and drops buffers of a
    Python memory resource: both deallocates run (the interpreter is alive during atexit
    handlers). A buffer still alive when the interpreter finalizes is not freed through Python
    then, and that skipped free is reported on stderr, naming the resource and the pointer."""
    script = ATEXIT_FIRST.format(tests=os.path.dirname(__file__))
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    leaked = lines[0].split()[1]
    assert lines[1:4] == ["closed True 1", "dropped 2", "native True"], out.stdout + out.stderr
    skipped = [l for l in out.stderr.splitlines() if f"RecordingResource.deallocate({leaked}" in l]
    assert len(skipped) == 1, out.stderr
    assert "shutting down" in skipped[0] and "leaked" in skipped[0], skipped
    cycle = [l for l in out.stderr.splitlines() if "MainMR.deallocate(0x" in l]
    assert len(cycle) == 3 and all("leaked" in l for l in cycle), out.stderr
    assert "Traceback" not in out.stderr, out.stderr
