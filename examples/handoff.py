#!/usr/bin/env python3
"""The stream hand-off demo in Python: who frees a buffer, on which stream, in which context.

The same three scenarios as the Rust example (memory/examples/handoff.rs), with the `custody`
package, whose names follow cuda.core 1.2 (porting is changing the import):

1. Hand-off: a producer stream fills a buffer, a consumer stream waits on an event and reads it,
   and `set_deallocation_stream(consumer)` orders the free after the read.
2. Context-less drop: a buffer recorded with the legacy default stream is dropped on a thread
   that never had a context; custody makes the recorded context current, frees, restores.
3. Graph-retained: a buffer used in a captured CUDA graph (`Device.create_graph_builder`) is
   closed by the user while the graph still holds it; closing the graph hands it to deferred
   cleanup, which frees it with its recipe while the user's thread has another context current
   (skipped, saying so, with a custody package that has no graph builder).

For each free it prints the pointer, the stream and context it ran in, the thread, and the
thread's context before and after: from the emulator's call log on custody's emulated driver,
from `cuCtxGetCurrent` and the memory pool's used bytes on a real GPU (driverlog.py). The first
lines say which driver was loaded. Exit status 0 when every check passed.

    CUSTODY_CUDA_DRIVER=$PWD/target/debug/libcuda_emu.so .venv/bin/python examples/handoff.py

(`cargo xtask demo` builds the package into .venv and chooses the driver.)
"""

import ctypes
import gc
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from driverlog import DriverView, custody_driver_path  # noqa: E402

SIZE = 1 << 16


class Demo:
    """The driver view, names for raw values, and the checks of the current scenario."""

    def __init__(self, drv):
        self.drv = drv
        self.names = {"context": {0: "none"},
                      "stream": {0: "NULL token", 1: "legacy default stream token",
                                 2: "per-thread default stream token"},
                      "thread": {}}
        self.checks = []
        self.failures = []
        self.name_thread()

    def name_thread(self):
        if self.drv.emulated:
            self.names["thread"][self.drv.thread_id()] = threading.current_thread().name

    def ctx(self, raw):
        name = self.names["context"].get(raw)
        return name if raw == 0 else ("%s (0x%x)" % (name, raw) if name else "0x%x" % raw)

    def stream(self, raw):
        name = self.names["stream"].get(raw)
        return "%s (0x%x)" % (name, raw) if name else "0x%x" % raw

    def check(self, ok, what):
        self.checks.append((bool(ok), what))
        if not ok:
            self.failures.append(what)

    def print_checks(self):
        print("  checks:")
        for ok, what in self.checks:
            print("    [%s] %s" % ("ok" if ok else "FAILED", what))
        self.checks = []

    def observe(self, release, outcome=None):
        """Runs `release` on the calling thread, recording the thread's context around it."""
        self.name_thread()
        seen = {"thread": threading.current_thread().name,
                "emu_thread": self.drv.thread_id(),
                "before": self.drv.current_context(), "from": self.drv.mark()}
        seen["outcome"] = release() or outcome
        seen["to"] = self.drv.mark()
        seen["after"] = self.drv.current_context()
        return seen

    def report_free(self, ptr, seen, stream, context):
        """Prints how `ptr` was freed and checks it ran on `stream` in `context` and left the
        freeing thread's context as it found it."""
        print("  freed 0x%x:" % ptr)
        print("    by       %s, on thread %s" % (seen["outcome"], seen["thread"]))
        print("    thread's context before %s, after %s" % (self.ctx(seen["before"]), self.ctx(seen["after"])))
        self.check(seen["before"] == seen["after"],
                   "thread %s's context binding is unchanged by the free" % seen["thread"])
        if not self.drv.emulated:
            print("    stream   %s (as recorded; a real driver keeps no call log)" % self.stream(stream))
            print("    context  %s (as recorded)" % self.ctx(context))
            return
        window = [c for c in self.drv.calls() if seen["from"] <= c["seq"] < seen["to"]]
        frees = [c for c in window if c.get("ptr") == ptr and c["function"].startswith("cuMemFree")]
        if len(frees) != 1:
            self.check(False, "exactly one free of 0x%x in the call log (found %d)" % (ptr, len(frees)))
            return
        free = frees[0]
        passed, resolved = free.get("stream") or 0, free.get("resolved_stream")
        print("    stream   %s%s (emulator's call log)" % (
            self.stream(passed),
            ", which the driver resolved to 0x%x" % resolved if resolved not in (None, passed) else ""))
        owner = free.get("stream_context")
        print("    context  %s current%s (emulator's call log)" % (
            self.ctx(free["context"]),
            "; the stream belongs to %s" % self.ctx(owner) if owner not in (None, free["context"]) else ""))
        on_thread = [c for c in window if c["thread"] == free["thread"]]
        steps = []
        for i, c in enumerate(on_thread):
            if c["function"] == "cuCtxSetCurrent":
                target = on_thread[i + 1]["context"] if i + 1 < len(on_thread) else seen["after"]
                steps.append("cuCtxSetCurrent(%s)" % self.ctx(target))
            elif c["function"] == "cuCtxGetCurrent":
                steps.append("cuCtxGetCurrent() = %s" % self.ctx(c["context"]))
            elif c.get("ptr") == ptr:
                steps.append("%s(0x%x, %s) = %s" % (c["function"], ptr, self.stream(c.get("stream") or 0),
                                                    "CUDA_SUCCESS" if c["result"] == 0 else "error %d" % c["result"]))
            else:
                steps.append("%s()" % c["function"])
        thread = self.names["thread"].get(free["thread"], "thread %d" % free["thread"])
        print("    driver calls on %s: %s" % (thread, ", ".join(steps)))
        hazards = ["%s: %s" % (h["kind"], h["detail"]) for h in self.drv.hazards() if h.get("ptr") == ptr]
        print("    hazards  %s" % ("; ".join(hazards) if hazards else
                                   "none (the checker saw the free ordered after every use)"))
        self.check(free["result"] == 0, "the free succeeded")
        self.check(passed == stream, "freed on the recorded stream %s" % self.stream(stream))
        if stream in (0, 1, 2):
            # A token means "the current context's stream": custody makes the recorded context
            # current for the call (docs/decisions.md D2).
            self.check(free["context"] == context, "freed with the recorded context %s current" % self.ctx(context))
        else:
            # A created stream names its context: the free is ordered there with whatever context
            # the thread has, so custody switches none (docs/decisions.md D2, docs/driver-facts.md F4, F8).
            self.check(free.get("stream_context") == context,
                       "freed on a stream of the recorded context %s" % self.ctx(context))
            self.check(not any(c["function"] == "cuCtxSetCurrent" for c in on_thread),
                       "no context switch for a free on a created stream")
        self.check(free["thread"] == seen["emu_thread"], "freed on the releasing thread (%s)" % seen["thread"])
        self.check(not hazards, "no stream-order hazard")

    def check_pool(self, baseline):
        """Checks that device 0's pool is back at `baseline` once context A has drained."""
        self.drv.synchronize()
        used = self.drv.pool_used()
        self.check(used == baseline, "pool used memory back at its baseline: %d bytes (baseline %d)" % (used, baseline))


def handle(obj):
    return int(getattr(obj, "handle", obj))


def hand_off(demo, custody, dev, mr, context_a):
    print("\n[1/3] stream hand-off: the producer fills, the consumer reads, the consumer frees")
    producer, consumer = dev.create_stream(), dev.create_stream()
    demo.names["stream"][handle(producer)] = "producer"
    demo.names["stream"][handle(consumer)] = "consumer"
    baseline = demo.drv.pool_used()
    buf = mr.allocate(SIZE, stream=producer)
    ptr = int(buf.handle)
    print("  allocated 0x%x (%d bytes) on %s" % (ptr, SIZE, demo.stream(handle(producer))))
    buf.fill(0x5A, stream=producer)
    consumer.wait(producer.record())
    print("  producer: fill with 0x5a, record an event; consumer: wait for the event")
    buf.set_deallocation_stream(consumer)
    print("  set_deallocation_stream(consumer)")
    host = custody.LegacyPinnedMemoryResource().allocate(SIZE, stream=consumer)
    buf.copy_to(host, stream=consumer)
    consumer.sync()
    read_ok = ctypes.string_at(int(host.handle), SIZE) == b"\x5a" * SIZE
    host.close()

    def close():
        try:
            buf.close()
            return "close() -> None"
        except Exception as error:  # noqa: BLE001 - reported as the outcome
            return "close() raised %s: %s" % (type(error).__name__, error)
    seen = demo.observe(close)
    demo.check(read_ok, "the consumer read back %d bytes of 0x5a" % SIZE)
    demo.check(seen["outcome"] == "close() -> None", "close() returned without error")
    demo.report_free(ptr, seen, handle(consumer), context_a)
    demo.check_pool(baseline)
    demo.print_checks()


def contextless_drop(demo, custody, mr, context_a):
    print("\n[2/3] a buffer recorded with the legacy default stream, dropped on a thread with no context")
    legacy = custody.LEGACY_DEFAULT_STREAM
    baseline = demo.drv.pool_used()
    holder = [mr.allocate(SIZE, stream=legacy)]
    ptr = int(holder[0].handle)
    holder[0].fill(0x11, stream=legacy)
    print("  allocated 0x%x (%d bytes) on thread MainThread with A current, on the legacy default stream" % (ptr, SIZE))
    print("  (on a thread with no context the raw cuMemFreeAsync(0x%x, CU_STREAM_LEGACY) fails with "
          "CUDA_ERROR_INVALID_CONTEXT: docs/driver-facts.md F2)" % ptr)
    box = {}

    def drop():
        holder.clear()
        gc.collect()

    thread = threading.Thread(target=lambda: box.update(seen=demo.observe(drop, "the last reference's drop")),
                              name="dropper")
    thread.start()
    thread.join()
    seen = box["seen"]
    print("  dropped on a new thread, \"dropper\", that never set a context")
    demo.check(seen["before"] == 0, "the dropping thread had no context")
    demo.report_free(ptr, seen, 1, context_a)
    demo.check_pool(baseline)
    demo.print_checks()


def graph_retained(demo, custody, dev, mr, context_a):
    print("\n[3/3] a buffer retained by a CUDA graph, freed by deferred cleanup")
    if not hasattr(dev, "create_graph_builder") or not hasattr(custody, "drain_deferred_cleanup"):
        print("  SKIPPED: custody's Python package has no Device.create_graph_builder / "
              "drain_deferred_cleanup yet (the Rust example shows this scenario)")
        return False
    stream = dev.create_stream()
    demo.names["stream"][handle(stream)] = "work"
    baseline = demo.drv.pool_used()
    buf = mr.allocate(SIZE, stream=stream)
    ptr = int(buf.handle)
    print("  allocated 0x%x (%d bytes) on %s" % (ptr, SIZE, demo.stream(handle(stream))))
    builder = dev.create_graph_builder()
    builder.begin_building()
    buf.fill(0x22, stream=builder)
    builder.end_building()
    graph = builder.complete()
    graph.launch(stream)
    stream.sync()
    print("  a graph captured a fill of the buffer; completed and launched")
    held = demo.drv.pool_used()
    since = demo.drv.mark()
    buf.close()
    demo.drv.synchronize()
    freed_early = (demo.drv.frees_of(ptr, since) if demo.drv.emulated
                   else demo.drv.pool_used() != held)
    demo.check(not freed_early, "the user's close() freed nothing: the graph still holds the memory")

    # Another context current on this thread: the free must still run in A.
    other = ctypes.c_void_p(0)
    device = ctypes.c_int(0)
    demo.drv._call("cuDeviceGet", ctypes.byref(device), 0)
    demo.drv._call("cuCtxCreate_v2", ctypes.byref(other), 0, device)  # pushed: now current
    demo.names["context"][other.value] = "B"
    print("  thread MainThread now has context B current (not the buffer's context)")
    graph.close()
    builder.close()
    print("  graph closed: the memory went to deferred cleanup")
    seen = demo.observe(lambda: "drain_deferred_cleanup() on this thread, which ran %s item(s)"
                        % custody.drain_deferred_cleanup())
    deadline = time.monotonic() + 30
    if demo.drv.emulated:
        while not demo.drv.frees_of(ptr, since) and time.monotonic() < deadline:
            time.sleep(0.001)
    else:
        # A driver may run the destructor later, on its own thread (G3): wait for the free.
        while demo.drv.pool_used() != baseline and time.monotonic() < deadline:
            custody.drain_deferred_cleanup()
            demo.drv.synchronize()
            time.sleep(0.001)
        seen["outcome"] = ("deferred cleanup (this thread's drain_deferred_cleanup() or custody's "
                           "cleanup worker: without a call log custody does not say which; shown: "
                           "the caller's thread)")
    frees = demo.drv.frees_of(ptr, since)
    if demo.drv.emulated and frees and frees[0]["thread"] != seen["emu_thread"]:
        # The cleanup worker got there first: report the free from its side of the log, and
        # probe the context it was left with by giving it one more item.
        worker = frees[0]["thread"]
        demo.names["thread"][worker] = "custody-cleanup"
        window = [c for c in demo.drv.calls() if c["seq"] >= since and c["thread"] == worker]
        until = demo.drv.mark()
        seen = dict(seen, thread="custody-cleanup", emu_thread=worker,
                    outcome="deferred cleanup in custody's cleanup worker",
                    before=window[0]["context"] if window else -1,
                    after=probe_worker(demo, custody, stream, worker),
                    **{"from": since, "to": until})
    demo.report_free(ptr, seen, handle(stream), context_a)
    demo.check(demo.drv.current_context() == other.value, "thread MainThread still has context B current")
    popped = ctypes.c_void_p(0)
    demo.drv._call("cuCtxPopCurrent_v2", ctypes.byref(popped))
    demo.drv._call("cuCtxDestroy_v2", popped)
    demo.check_pool(baseline)
    demo.print_checks()
    return True


def probe_worker(demo, custody, stream, worker):
    """The context current on custody's cleanup worker (emulator thread `worker`) now: drops a
    pinned host buffer, whose free a drop hands to the worker (docs/decisions.md D9), and reads the
    context the worker's first call for it saw. -1 when the worker did not run it."""
    since = demo.drv.mark()
    pinned = custody.LegacyPinnedMemoryResource().allocate(256, stream=stream)
    ptr = int(pinned.handle)
    del pinned
    gc.collect()
    deadline = time.monotonic() + 5
    while not demo.drv.frees_of(ptr, since) and time.monotonic() < deadline:
        time.sleep(0.001)
    frees = demo.drv.frees_of(ptr, since)
    if not frees or frees[0]["thread"] != worker:
        return -1
    first = [c for c in demo.drv.calls() if c["seq"] >= since and c["thread"] == worker]
    return first[0]["context"] if first else -1


def main():
    print("custody hand-off demo (Python)")
    try:
        import custody
    except ImportError as error:
        print("handoff (Python): FAILED: the custody package does not import: %s" % error)
        return 1
    drv = DriverView(custody_driver_path())
    demo = Demo(drv)
    dev = custody.Device(0)
    dev.set_current()
    context_a = drv.current_context()
    demo.names["context"][context_a] = "A"
    print("driver: %s" % drv.describe())
    print("        facts below are read from %s" % (
        "the emulator's call log and hazard checker" if drv.emulated else
        "cuCtxGetCurrent around each free and the memory pool's used bytes (no call log on a real driver)"))
    print("contexts: A = device 0's primary context (0x%x)" % context_a)
    mr = custody.DeviceMemoryResource(dev)

    hand_off(demo, custody, dev, mr, context_a)
    contextless_drop(demo, custody, mr, context_a)
    graph_ran = graph_retained(demo, custody, dev, mr, context_a)

    print()
    if demo.failures:
        print("handoff (Python): FAILED: %d check(s): %s" % (len(demo.failures), "; ".join(demo.failures)))
        return 1
    print("handoff (Python): passed on the %s: %s" % (
        "emulated driver" if drv.emulated else "real GPU",
        "3 scenarios" if graph_ran else "2 of 3 scenarios (graph-retained skipped: see above)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
