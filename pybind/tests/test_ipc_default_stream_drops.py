"""IPC producer and consumer on the default stream, the consumer dropping what it imported: the
shape that did not finish within 120 s on the H200 (2026-12-01) and passes in about a second on
the emulator. A producer allocates from an IPC-enabled pool, fills, sends the buffer to a spawned
child through a ``multiprocessing`` queue (it pickles as its pool and descriptor), waits for the
child's acknowledgement, closes it, and repeats, forty times. In the child four threads take the
buffers from the queue: each unpickles (imports) on its own thread, with ``default_stream()`` as
the import's deallocation stream; copies the buffer into pinned memory on ``default_stream()``;
waits for that copy; checks the bytes; drops the import and the pinned copy (no ``close()``); and
acknowledges.

Unlike ``test_ipc_producer_consumer.py``, the child never closes an import: its free is issued
on the default stream when the last reference goes and nothing waits for it, so the producer may
free its allocation before the importer's free has completed, which the driver API asks an
importing process not to allow (docs/gpu-validation.md, "The IPC producer/consumer on the H200",
says what that means here).

Bounded everywhere: every queue operation and join has a timeout; a producer that waits too long
for an acknowledgement has the child dump its threads' Python stacks (``SIGUSR2``, faulthandler)
before the test fails; the child dumps them and exits if it is still running after
``CHILD_LIMIT_S``. A producer stuck inside a driver call is the GPU runner's to catch: run.py runs
this file in a pytest process of its own (``own_process``) with its per-test limit and hang
diagnostics (docs/testing.md, "When a test hangs")."""

from __future__ import annotations

import ctypes
import faulthandler
import multiprocessing
import os
import queue as queue_module
import signal
import threading

import pytest

import custody
from conftest import EMU, dump_stacks_on_signal

ROUNDS = 40
TAKERS = 4
SIZE = 1 << 16
QUEUE_TIMEOUT_S = 60
CHILD_LIMIT_S = 240


def _pattern(n: int) -> int:
    return n % 251


def _child(work, acks):
    """The consumer: four threads take, copy, check, drop and acknowledge. Sends (round, ok,
    detail) per buffer, then ("done", report)."""
    dump_stacks_on_signal()
    faulthandler.dump_traceback_later(CHILD_LIMIT_S, exit=True)
    report = {"errors": [], "hung": 0}
    try:
        pinned = custody.LegacyPinnedMemoryResource()

        def taker():
            try:
                while True:
                    item = work.get(timeout=QUEUE_TIMEOUT_S)  # unpickles: imports here
                    if item is None:
                        break
                    n, buf = item
                    s = custody.default_stream()
                    staging = pinned.allocate(buf.size, stream=s)
                    staging.copy_from(buf, stream=s)
                    s.sync()
                    ok = ctypes.string_at(staging.handle, SIZE) == bytes([_pattern(n)]) * SIZE
                    del item, buf, staging  # dropped, not closed
                    acks.put((n, ok, threading.get_ident()))
                # Nothing of this thread's is left on a per-thread stream when it ends (it is
                # the legacy stream unless CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM says).
                custody.default_stream().sync()
            except BaseException as error:  # noqa: BLE001 - reported to the producer
                report["errors"].append(repr(error))
                acks.put((-1, False, repr(error)))

        threads = [threading.Thread(target=taker, name=f"taker-{i}") for i in range(TAKERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(QUEUE_TIMEOUT_S * 2)
        report["hung"] = sum(t.is_alive() for t in threads)
        if EMU is not None:
            custody.drain_deferred_cleanup()
            report["live_ipc"] = [a for a in EMU.allocations() if a["kind"] == "ipc"]
            report["hazards"] = EMU.hazards()
        acks.put(("done", report))
    except BaseException as error:  # noqa: BLE001 - sent to the producer
        import traceback

        acks.put(("error", f"{error!r}\n{traceback.format_exc()}"))


def _ask_for_stacks(child) -> None:
    """Has the child write its threads' Python stacks to its stderr (the test's)."""
    if child.pid is not None and child.is_alive():
        try:
            os.kill(child.pid, signal.SIGUSR2)
        except OSError:
            pass
        child.join(timeout=2)  # time to write them; it does not exit on the signal


@pytest.mark.own_process
def test_a_consumer_that_drops_imports_on_the_default_stream_acknowledges_forty_buffers(
    device, stream
):
    mr = custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions(ipc_enabled=True))
    before = mr.attributes.used_mem_current
    ctx = multiprocessing.get_context("spawn")
    work, acks = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_child, args=(work, acks), daemon=True)
    child.start()
    acknowledged = []
    outcome = None
    try:
        for n in range(ROUNDS):
            buf = mr.allocate(SIZE, stream=stream)
            buf.fill(_pattern(n), stream=stream)
            stream.sync()
            work.put((n, buf))
            try:
                ack = acks.get(timeout=QUEUE_TIMEOUT_S)
            except queue_module.Empty:
                _ask_for_stacks(child)
                pytest.fail(f"round {n}: no acknowledgement in {QUEUE_TIMEOUT_S} s (the child's "
                            "stacks are on stderr)")
            assert ack[0] != "error", ack[1]
            assert ack[:2] == (n, True), ack
            acknowledged.append(n)
            buf.close()
        for _ in range(TAKERS):
            work.put(None)
        try:
            outcome = acks.get(timeout=QUEUE_TIMEOUT_S * 2)
        except queue_module.Empty:
            _ask_for_stacks(child)
            pytest.fail("the child did not finish (its stacks are on stderr)")
    finally:
        child.join(timeout=QUEUE_TIMEOUT_S)
        if child.is_alive():
            child.kill()
            child.join(timeout=10)
    assert outcome[0] == "done", outcome
    report = outcome[1]
    assert report["errors"] == [] and report["hung"] == 0, report
    assert acknowledged == list(range(ROUNDS))
    assert child.exitcode == 0
    if EMU is not None:
        assert report["live_ipc"] == [], "an import was left mapped in the child"
        assert report["hazards"] == [], report["hazards"]
    device.sync()
    assert mr.attributes.used_mem_current == before
