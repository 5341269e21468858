"""IPC producer and consumer (docs/reference-notes.md section 5, scenarios 59, 62, 64): a
producer allocates from an IPC-enabled pool, fills, sends the buffer to a spawned child through a
``multiprocessing`` queue (the buffer pickles as its pool and descriptor), waits for the child's
acknowledgement, closes, and repeats; the child imports, reads and closes each buffer on four
threads, then acknowledges. Forty rounds, three ways of sharing the work in the child:

- ``readers``: the child unpickles (one import) and four threads read it;
- ``takers``: four child threads each take buffers from the queue (each unpickles: imports on
  its own thread, which has no context until ``_reduce_helper`` makes one current);
- ``importers``: the child unpickles, and four threads each import the descriptor again on a
  stream of their own (imports of one mapping, shared, unmapped by the last).

The driver requires an importing process's free of an imported pointer to have completed before
the exporting process frees the allocation; the child closes its imports before it
acknowledges, and an explicit ``close()`` of an imported buffer returns once its unmap has run.
Every round must read the producer's bytes; nothing may be left mapped in the child.

Bounded: every queue operation and join has a timeout, and the child dumps its threads' stacks
(faulthandler) and exits if it is still running after ``CHILD_LIMIT_S``, so a deadlock fails
the test with the stacks instead of hanging it."""

from __future__ import annotations

import ctypes
import faulthandler
import multiprocessing
import queue as queue_module
import threading

import pytest

import custody
from conftest import EMU

ROUNDS = 40
READERS = 4
SIZE = 1 << 16
QUEUE_TIMEOUT_S = 60
CHILD_LIMIT_S = 240


def _pattern(n: int) -> int:
    return n % 251


def _read(buf, stream) -> bytes:
    staging = custody.LegacyPinnedMemoryResource().allocate(buf.size, stream=stream)
    try:
        staging.copy_from(buf, stream=stream)
        stream.sync()
        return ctypes.string_at(staging.handle, buf.size)
    finally:
        staging.close()


def _child(mode, work, acks):
    """The consumer. Sends (round, ok, detail) per round, then ("done", report)."""
    faulthandler.dump_traceback_later(CHILD_LIMIT_S, exit=True)
    try:
        report = {"errors": []}
        if mode == "takers":
            _takers(work, acks, report)
        else:
            _one_receiver(mode, work, acks, report)
        if EMU is not None:
            custody.drain_deferred_cleanup()
            report["live_ipc"] = [a for a in EMU.allocations() if a["kind"] == "ipc"]
            report["hazards"] = EMU.hazards()
        acks.put(("done", report))
    except BaseException as error:  # noqa: BLE001 - sent to the test
        import traceback

        acks.put(("error", f"{error!r}\n{traceback.format_exc()}"))


def _one_receiver(mode, work, acks, report):
    """``readers`` and ``importers``: the main thread unpickles, four threads read."""
    for _ in range(ROUNDS):
        item = work.get(timeout=QUEUE_TIMEOUT_S)
        n, buf, descriptor = item
        expected = bytes([_pattern(n)]) * SIZE
        results = []
        lock = threading.Lock()

        def reader():
            try:
                custody.Device(0).set_current()
                s = custody.Device(0).create_stream()
                if mode == "importers":
                    mine = custody.Buffer.from_ipc_descriptor(
                        buf.memory_resource, descriptor, stream=s
                    )
                    data = _read(mine, s)
                    mine.close()
                else:
                    data = _read(buf, s)
                s.close()
                with lock:
                    results.append(data == expected)
            except BaseException as error:  # noqa: BLE001 - reported in the ack
                with lock:
                    results.append(repr(error))

        threads = [threading.Thread(target=reader) for _ in range(READERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(QUEUE_TIMEOUT_S)
        hung = sum(t.is_alive() for t in threads)
        buf.close()  # the import is unmapped, and that has run, before the acknowledgement
        del item, buf
        acks.put((n, results == [True] * READERS and not hung, (results, hung)))


def _takers(work, acks, report):
    """Four threads each take buffers from the queue and read them."""

    def taker():
        try:
            s = None
            while True:
                item = work.get(timeout=QUEUE_TIMEOUT_S)  # unpickles (imports) here
                if item is None:
                    return
                n, buf, _descriptor = item
                if s is None:
                    s = custody.Device(0).create_stream()  # _reduce_helper made a context
                ok = _read(buf, s) == bytes([_pattern(n)]) * SIZE
                buf.close()
                del item, buf
                acks.put((n, ok, threading.get_ident()))
        except BaseException as error:  # noqa: BLE001 - reported
            report["errors"].append(repr(error))
            acks.put((-1, False, repr(error)))

    threads = [threading.Thread(target=taker) for _ in range(READERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(QUEUE_TIMEOUT_S * 2)
    report["hung"] = sum(t.is_alive() for t in threads)


@pytest.mark.parametrize("mode", ["readers", "takers", "importers"])
def test_producer_and_consumer_exchange_forty_buffers(device, stream, mode):
    mr = custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions(ipc_enabled=True))
    before = mr.attributes.used_mem_current
    ctx = multiprocessing.get_context("spawn")
    work, acks = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_child, args=(mode, work, acks), daemon=True)
    child.start()
    acknowledged = []
    try:
        for n in range(ROUNDS):
            buf = mr.allocate(SIZE, stream=stream)
            buf.fill(_pattern(n), stream=stream)
            stream.sync()
            work.put((n, buf, bytes(buf.ipc_descriptor)))
            try:
                ack = acks.get(timeout=QUEUE_TIMEOUT_S)
            except queue_module.Empty:
                pytest.fail(f"round {n}: no acknowledgement in {QUEUE_TIMEOUT_S} s (deadlock?)")
            assert ack[0] != "error", ack[1]
            assert ack[:2] == (n, True), ack
            acknowledged.append(n)
            buf.close()
        if mode == "takers":
            for _ in range(READERS):
                work.put(None)
        try:
            outcome = acks.get(timeout=QUEUE_TIMEOUT_S)
        except queue_module.Empty:
            pytest.fail("the child did not finish (deadlock?)")
    finally:
        child.join(timeout=QUEUE_TIMEOUT_S)
        if child.is_alive():
            child.kill()
            child.join(timeout=10)
    assert outcome[0] == "done", outcome
    report = outcome[1]
    assert report["errors"] == [] and report.get("hung", 0) == 0, report
    assert acknowledged == list(range(ROUNDS))
    assert child.exitcode == 0
    if EMU is not None:
        assert report["live_ipc"] == [], "an import was left mapped in the child"
        assert report["hazards"] == [], report["hazards"]
    device.sync()
    assert mr.attributes.used_mem_current == before
