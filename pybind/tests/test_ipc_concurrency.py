"""Concurrent IPC imports of one descriptor (docs/reference-notes.md section 5, scenario 62): in a
spawned child, eight threads import the same descriptor over and over while another thread closes
(or drops) the previous imports and a third keeps the GIL busy with Python work. No deadlock (every
import and free runs with the GIL released before the import lock is taken), every import reads the
parent's bytes, no exception at all, and the shared mapping is unmapped exactly once per time it
was mapped: on the emulator no ``ipc`` allocation is left and no hazard (``double_free``
included) was seen; on a real driver a double unmap would surface as a raised ``CUDAError``
(explicit close) or a ``CUDAWarning`` (drop), and both are asserted absent.

Bounded iteration counts; the join timeouts only turn a hang into a failure."""

import ctypes
import multiprocessing
import queue as queue_module
import threading
import warnings

import custody
from conftest import EMU

IMPORTERS = 8
IMPORTS_PER_THREAD = 40
SIZE = 4096
FILL = 0x6B
JOIN_TIMEOUT_S = 120


def _child(inbox, results):
    """Runs in a spawned process; sends back ("ok", report) or ("error", text)."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = _run_child(inbox)
        report["cuda_warnings"] = [
            str(w.message) for w in caught if issubclass(w.category, custody.CUDAWarning)
        ]
        results.put(("ok", report))
    except BaseException as error:  # noqa: BLE001 - sent back to the test
        import traceback

        results.put(("error", f"{error!r}\n{traceback.format_exc()}"))


def _run_child(inbox):
    dev = custody.Device(0)
    dev.set_current()
    mr = inbox.get(timeout=60)  # the parent's pool, opened here (mapped)
    descriptor = custody.IPCBufferDescriptor.from_bytes(inbox.get(timeout=60))
    assert mr.is_mapped and mr.is_ipc_enabled
    if EMU is not None:
        EMU.clear_hazards()
        EMU.clear_calls()

    handoff = queue_module.Queue()
    errors = []
    mismatches = []
    addresses = set()
    closed_flags = []
    stop_gil = threading.Event()
    gil_rounds = [0]
    lock = threading.Lock()

    # Round r: the closer closes round r - 1's imports but one, then (at the barrier) the last
    # one, whose close unmaps the mapping, while every importer imports round r: the unmap and
    # the new imports race, and either order must be safe.
    rounds = threading.Barrier(IMPORTERS + 1)
    streams = []

    def failed(*what):
        with lock:
            errors.append(what)
        rounds.abort()

    def importer(index):
        try:
            dev.set_current()
            s = dev.create_stream()
            with lock:
                streams.append(s)
            staging = custody.LegacyPinnedMemoryResource().allocate(SIZE, stream=s)
            for i in range(IMPORTS_PER_THREAD):
                rounds.wait(JOIN_TIMEOUT_S)
                buf = custody.Buffer.from_ipc_descriptor(mr, descriptor, stream=s)
                staging.fill(0, stream=s)
                staging.copy_from(buf, stream=s)
                s.sync()
                data = ctypes.string_at(staging.handle, SIZE)
                with lock:
                    addresses.add(buf.handle)
                    if data != bytes([FILL]) * SIZE:
                        mismatches.append((index, i))
                handoff.put(buf)
                del buf
            rounds.wait(JOIN_TIMEOUT_S)  # the closer takes the last round
            staging.close()
        except BaseException as error:  # noqa: BLE001 - collected and asserted empty
            failed("importer", index, repr(error))

    def closer():
        n = 0

        def release(item):
            nonlocal n
            n += 1
            if n % 2:
                item.close()  # explicit: a failed unmap would raise here
                with lock:
                    closed_flags.append(item.is_closed)
            # even n: the del below drops the last reference (a failure would be a CUDAWarning)

        try:
            for r in range(IMPORTS_PER_THREAD + 1):
                previous = []
                if r > 0:  # round r - 1's imports, all handed over before the barrier
                    previous = [handoff.get(timeout=JOIN_TIMEOUT_S) for _ in range(IMPORTERS)]
                    while len(previous) > 1:
                        release(previous.pop())
                rounds.wait(JOIN_TIMEOUT_S)
                if previous:
                    release(previous.pop())
        except BaseException as error:  # noqa: BLE001 - collected and asserted empty
            failed("closer", repr(error))

    def gil_holder():
        # Pure Python work: holds the GIL between the interpreter's switch points.
        table = {}
        while not stop_gil.is_set() and gil_rounds[0] < 10_000_000:
            total = 0
            for k in range(2000):
                total += k * k
                table[k % 97] = total
            sorted(table.items(), key=lambda kv: -kv[1])
            gil_rounds[0] += 1

    threads = [threading.Thread(target=importer, args=(i,), daemon=True) for i in range(IMPORTERS)]
    closing = threading.Thread(target=closer, daemon=True)
    busy = threading.Thread(target=gil_holder, daemon=True)
    busy.start()
    closing.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
    closing.join(JOIN_TIMEOUT_S)
    stop_gil.set()
    busy.join(JOIN_TIMEOUT_S)
    hung = [t.name for t in threads + [closing, busy] if t.is_alive()]
    assert not hung, f"threads still running (deadlock?): {hung}"
    assert handoff.empty()
    custody.drain_deferred_cleanup()
    for s in streams:
        s.sync()
        s.close()

    # After every close and drop: one more import re-maps and reads the same bytes.
    s = dev.create_stream()
    again = custody.Buffer.from_ipc_descriptor(mr, descriptor, stream=s)
    staging = custody.LegacyPinnedMemoryResource().allocate(SIZE, stream=s)
    staging.copy_from(again, stream=s)
    s.sync()
    final_read = ctypes.string_at(staging.handle, SIZE) == bytes([FILL]) * SIZE
    addresses.add(again.handle)
    again.close()
    staging.close()
    s.sync()
    s.close()
    custody.drain_deferred_cleanup()

    report = {
        "errors": errors,
        "mismatches": mismatches,
        "closed_flags_ok": all(closed_flags) and len(closed_flags) > 0,
        "addresses": len(addresses),
        "gil_rounds": gil_rounds[0],
        "final_read": final_read,
    }
    if EMU is not None:
        calls = EMU.calls()
        imports = [
            c for c in calls if c["function"] == "cuMemPoolImportPointer" and c["result"] == 0
        ]
        report["imports"] = len(imports)  # mappings made (the import call logs no pointer)
        # By identity (the allocation each import made), not by address.
        mapped = {c.get("alloc") for c in imports}
        report["frees"] = [
            c for c in calls if c["function"] == "cuMemFreeAsync" and c.get("alloc") in mapped
        ]
        report["live_ipc"] = [a for a in EMU.allocations() if a["kind"] == "ipc"]
        report["hazards"] = EMU.hazards()
    return report


def test_concurrent_imports_while_another_thread_closes(device, stream):
    """62: 8 threads x 40 imports of one descriptor, a closer thread, a GIL-bound thread."""
    mr = custody.DeviceMemoryResource(0, custody.DeviceMemoryResourceOptions(ipc_enabled=True))
    buf = mr.allocate(SIZE, stream=stream)
    buf.fill(FILL, stream=stream)
    stream.sync()
    ctx = multiprocessing.get_context("spawn")
    inbox, results = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_child, args=(inbox, results))
    child.start()
    try:
        inbox.put(mr)
        inbox.put(bytes(buf.ipc_descriptor))
        outcome = results.get(timeout=2 * JOIN_TIMEOUT_S + 120)
    finally:
        child.join(timeout=JOIN_TIMEOUT_S)
        if child.is_alive():
            child.kill()
    assert outcome[0] == "ok", outcome[1]
    report = outcome[1]
    assert report["errors"] == [], report["errors"]
    assert report["mismatches"] == [], report["mismatches"]
    assert report["closed_flags_ok"]
    assert report["final_read"]
    assert report["gil_rounds"] > 0
    assert report["cuda_warnings"] == [], report["cuda_warnings"]
    if EMU is not None:
        # Every mapping made was unmapped exactly once, successfully, and none is left.
        frees = report["frees"]
        assert all(f["result"] == 0 for f in frees), frees
        assert len(frees) == report["imports"] >= 2, (frees, report["imports"])
        assert report["live_ipc"] == [], report["live_ipc"]
        assert [h["kind"] for h in report["hazards"]] == [], report["hazards"]
    assert child.exitcode == 0
    buf.close()
