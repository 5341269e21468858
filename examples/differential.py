#!/usr/bin/env python3
"""Buffer-lifetime scenarios run with custody and with NVIDIA's cuda.core, side by side.

Each scenario is one of docs/reference-notes.md section 5's cases whose outcome can be observed
from outside the library: whether a buffer was freed or leaked, on which stream and in which
context its free or its memory resource's `deallocate` ran, which context the freeing thread
had afterwards, and what was raised, warned or written to stderr. Every (scenario, library) pair
runs in its own Python process, so a crash or a poisoned context cannot leak into the next one.

    python3 examples/differential.py [--json PATH] [--only TEXT] [--libs custody,cuda.core]

custody is imported as `custody` (built with `maturin develop`, or the GPU bundle's wheel) and
loads `CUSTODY_CUDA_DRIVER` or `libcuda.so.1`; cuda.core (1.2 or later) is imported as
`cuda.core` and loads `libcuda.so.1`. A library that does not import gets a column saying so;
an API a library lacks is reported as "n/a" for that cell. On custody's emulated driver the
custody column also shows the free as the emulator's call log recorded it.

The custody column is checked against the decisions in docs/decisions.md (D2-D6): a cell
that contradicts them is marked UNEXPECTED. cuda.core's cells are reported, never judged: they
are the reference, and where they differ from custody that is the point of the table.

Exit status: 0 when every custody cell is as docs/decisions.md decides, 1 when one is not (or a
scenario crashed), 2 when custody cannot be imported. Python 3.11+ (custody's floor), standard
library only.
"""

import argparse
import datetime
import gc
import json
import os
import platform
import subprocess
import sys
import textwrap
import threading
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from driverlog import SYSTEM_DRIVER, DriverView, custody_driver_path  # noqa: E402

LIBRARIES = ("custody", "cuda.core")
SIZE = 1 << 16
RESULT_PREFIX = "RESULT "


class NotAvailable(Exception):
    """The library under test lacks an API a scenario needs: the cell reads "n/a"."""


# ---------------------------------------------------------------------------------------------
# The child side: one scenario, one library, one process.


class Library:
    """The package under test, its driver view and the names a scenario needs."""

    def __init__(self, name):
        self.name = name
        if name == "custody":
            import custody as mod
            self.driver = DriverView(custody_driver_path())
        else:
            import cuda.core as mod
            if not hasattr(mod, "Device"):  # cuda.core before 1.0
                import cuda.core.experimental as mod
            self.driver = DriverView(SYSTEM_DRIVER)
        self.mod = mod
        self.version = getattr(mod, "__version__", "unknown version")

    def get(self, dotted):
        """`mod.A.b`, or NotAvailable naming what is missing."""
        value = self.mod
        for part in dotted.split("."):
            if not hasattr(value, part):
                raise NotAvailable("%s has no %s" % (self.name, dotted))
            value = getattr(value, part)
        return value


class World:
    """Device 0 current on the main thread, and names for the raw values a scenario sees."""

    def __init__(self, lib):
        self.lib = lib
        self.drv = lib.driver
        self.dev = lib.get("Device")(0)
        self.dev.set_current()
        self.context_a = self.drv.current_context()
        self.names = {"context": {0: "none", self.context_a: "A"},
                      "stream": {0: "NULL token", 1: "legacy token", 2: "per-thread token"},
                      "thread": {}}
        self.name_this_thread()

    def name_this_thread(self):
        """Names the calling thread's id in the emulator's call log after the Python thread."""
        if self.drv.emulated:
            self.names["thread"][self.drv.thread_id()] = threading.current_thread().name

    def pool_mr(self):
        return self.lib.get("DeviceMemoryResource")(0)

    def stream(self, label):
        stream = self.dev.create_stream()
        self.names["stream"][handle_value(stream)] = label
        return stream

    def ctx(self, raw):
        return self.names["context"].get(raw, "0x%x" % raw)

    def stream_name(self, raw):
        if raw is None:
            return "none"
        if not isinstance(raw, int):
            return str(raw)
        return self.names["stream"].get(raw, "0x%x" % raw)

    def freed_since(self, baseline):
        """Synchronizes context A and compares device 0's pool with `baseline`."""
        self.drv.synchronize()
        used = self.drv.pool_used()
        return used == baseline, used - baseline

    def free_call(self, ptr, since):
        """The emulator's record of the free of `ptr`, as text; None on a real driver."""
        if not self.drv.emulated:
            return None
        frees = self.drv.frees_of(ptr, since)
        if not frees:
            return "no free of 0x%x in the call log" % ptr
        c = frees[-1]
        resolved = c.get("resolved_stream")
        return "%s on %s%s in context %s, %s -> %s" % (
            c["function"], self.stream_name(c.get("stream")),
            "" if resolved in (None, c.get("stream")) else " (resolved 0x%x)" % resolved,
            self.ctx(c["context"]), "on thread %s" % self.names["thread"].get(c["thread"], c["thread"]),
            "CUDA_SUCCESS" if c["result"] == 0 else "error %d" % c["result"])


def handle_value(obj):
    """The raw value of a stream (or a Stream-like object), as an int when it has one."""
    for candidate in (getattr(obj, "handle", obj), obj):
        try:
            return int(candidate)
        except (TypeError, ValueError):
            continue
    return repr(obj)


class Observer:
    """Records Python warnings (from any thread) and unraisable exceptions."""

    def __enter__(self):
        self._catcher = warnings.catch_warnings(record=True)
        self.records = self._catcher.__enter__()
        warnings.simplefilter("always")
        self.unraisable = []
        self._old_hook = sys.unraisablehook
        sys.unraisablehook = lambda u: self.unraisable.append(
            "unraisable %s: %s" % (type(u.exc_value).__name__, u.exc_value))
        return self

    def __exit__(self, *exc):
        sys.unraisablehook = self._old_hook
        self._catcher.__exit__(*exc)
        return False

    def messages(self):
        return ["%s: %s" % (w.category.__name__, w.message) for w in self.records] + self.unraisable


def on_fresh_thread(fn):
    """Runs `fn` on a new thread that has never had a CUDA context; returns its result or
    re-raises its exception."""
    box = {}

    def body():
        try:
            box["value"] = fn()
        except BaseException as error:  # noqa: B902 - handed back to the caller
            box["error"] = error

    thread = threading.Thread(target=body, name="worker")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def exception_text(error):
    text = str(error).splitlines()[0] if str(error) else ""
    return "%s: %s" % (type(error).__name__, text[:160]) if text else type(error).__name__


def recording_mr(world, fail=False):
    """A Python memory resource that records each `deallocate` (pointer, stream, the context
    current inside it, thread) and then frees with `cuMemFree_v2`, or raises when `fail`."""
    base = world.lib.get("MemoryResource")
    drv = world.drv

    class RecordingMemoryResource(base):
        def __init__(self):
            try:
                super().__init__()
            except TypeError:
                pass
            self.calls = []

        def allocate(self, size, stream=None):
            raise NotImplementedError("this resource only adopts")

        def deallocate(self, ptr, size, stream=None):
            self.calls.append({"ptr": int(ptr), "size": int(size),
                               "stream": None if stream is None else handle_value(stream),
                               "context": drv.current_context(),
                               "thread": threading.current_thread().name})
            if fail:
                raise RuntimeError("deallocate failed on purpose")
            drv.mem_free(int(ptr))

        @property
        def is_device_accessible(self):
            return True

        @property
        def is_host_accessible(self):
            return False

        @property
        def device_id(self):
            return 0

    return RecordingMemoryResource()


def deallocate_text(world, calls):
    if not calls:
        return "deallocate not called"
    return "; ".join("deallocate(0x%x) on thread %s, stream %s, context %s" % (
        c["ptr"], c["thread"], world.stream_name(c["stream"]), world.ctx(c["context"])) for c in calls)


# Each scenario returns a dict: outcome (one line) and any of freed, free_call, thread_context,
# deallocate (list of calls), exception, buffer_closed, warnings, facts (extra lines).


def drop_on_fresh_thread(world, holder):
    """Drops the only reference in `holder` on a fresh thread; returns its context before and
    after."""
    def body():
        world.name_this_thread()
        before = world.drv.current_context()
        holder.clear()
        gc.collect()
        return before, world.drv.current_context()
    return on_fresh_thread(body)


def pool_buffer_dropped_elsewhere(world, stream_name):
    stream = world.lib.get(stream_name)
    mr = world.pool_mr()
    baseline = world.drv.pool_used()
    holder = [mr.allocate(SIZE, stream=stream)]
    ptr = int(holder[0].handle)
    world.drv.synchronize()
    since = world.drv.mark()
    with Observer() as seen:
        before, after = drop_on_fresh_thread(world, holder)
    freed, delta = world.freed_since(baseline)
    return {"outcome": "freed" if freed else "leaked (%d bytes still in use)" % delta,
            "freed": freed, "free_call": world.free_call(ptr, since),
            "thread_context": "%s before, %s after" % (world.ctx(before), world.ctx(after)),
            "thread_context_after": world.ctx(after), "warnings": seen.messages()}


def s_legacy_drop(world):
    return pool_buffer_dropped_elsewhere(world, "LEGACY_DEFAULT_STREAM")


def s_ptds_drop(world):
    return pool_buffer_dropped_elsewhere(world, "PER_THREAD_DEFAULT_STREAM")


def open_buffer(world):
    return world.pool_mr().allocate(SIZE, stream=world.stream("s"))


def is_closed(buf):
    value = getattr(buf, "is_closed", None)
    if value is None:
        return int(buf.handle) == 0
    return bool(value() if callable(value) else value)


def call_outcome(action, buf):
    world_result = {}
    with Observer() as seen:
        try:
            action()
            world_result["outcome"] = "no error"
        except Exception as error:  # noqa: BLE001 - the outcome under test
            world_result["outcome"] = world_result["exception"] = exception_text(error)
    world_result["warnings"] = seen.messages()
    world_result["buffer_closed"] = is_closed(buf)
    return world_result


def s_set_none(world):
    buf = open_buffer(world)
    world.lib.get("Buffer.set_deallocation_stream")
    result = call_outcome(lambda: buf.set_deallocation_stream(None), buf)
    buf.close()
    return result


def s_set_int(world):
    buf = open_buffer(world)
    world.lib.get("Buffer.set_deallocation_stream")
    result = call_outcome(lambda: buf.set_deallocation_stream(5), buf)
    buf.close()
    return result


def s_set_on_closed(world):
    buf = open_buffer(world)
    world.lib.get("Buffer.set_deallocation_stream")
    s2 = world.stream("s2")
    buf.close()
    return call_outcome(lambda: buf.set_deallocation_stream(s2), buf)


def s_close_object_on_closed(world):
    buf = open_buffer(world)
    buf.close()
    return call_outcome(lambda: buf.close(stream=object()), buf)


def adopt(world, mr, stream=None):
    from_handle = world.lib.get("Buffer.from_handle")
    ptr = world.drv.mem_alloc(SIZE)
    kwargs = {} if stream is None else {"stream": stream}
    return ptr, from_handle(ptr, SIZE, mr=mr, **kwargs)


def s_from_handle_contextless(world):
    mr = recording_mr(world)
    from_handle = world.lib.get("Buffer.from_handle")
    ptr = world.drv.mem_alloc(SIZE)  # the caller's memory, in context A

    def body():
        try:
            buf = from_handle(ptr, SIZE, mr=mr)
        except Exception as error:  # noqa: BLE001 - the outcome under test
            return exception_text(error)
        buf.close()
        return None

    with Observer() as seen:
        raised = on_fresh_thread(body)
    freed_by_mr = any(c["ptr"] == ptr for c in mr.calls)
    if not freed_by_mr:
        world.drv.mem_free(ptr)  # still the caller's: free it
    if raised is None:
        outcome = "adopted with no error (a context-less thread recorded a default-stream recipe)"
    elif freed_by_mr:
        outcome = "%s, AND the caller's pointer was freed by mr.deallocate" % raised
    else:
        outcome = "%s; the pointer stays the caller's" % raised
    return {"outcome": outcome, "exception": raised, "deallocate": mr.calls,
            "warnings": seen.messages()}


def raising_mr_buffer(world):
    mr = recording_mr(world, fail=True)
    ptr, buf = adopt(world, mr, stream=world.stream("s"))
    return mr, ptr, buf


def s_mr_raises_drop(world):
    mr, ptr, buf = raising_mr_buffer(world)
    holder = [buf]
    del buf
    with Observer() as seen:
        try:
            holder.clear()
            gc.collect()
            raised = None
        except Exception as error:  # noqa: BLE001 - the outcome under test
            raised = exception_text(error)
    world.drv.mem_free(ptr)
    messages = seen.messages()
    return {"outcome": raised or ("reported: %d warning(s)" % len(messages) if messages
                                  else "nothing raised or warned"),
            "exception": raised, "deallocate": mr.calls, "warnings": messages}


def s_mr_raises_close(world):
    mr, ptr, buf = raising_mr_buffer(world)
    result = call_outcome(buf.close, buf)
    world.drv.mem_free(ptr)
    result["deallocate"] = mr.calls
    if "exception" not in result:
        result["outcome"] = "no exception" + ("; %d warning(s)" % len(result["warnings"])
                                              if result["warnings"] else "")
    return result


def mr_buffer_dropped_contextless(world, stream):
    mr = recording_mr(world)
    ptr, buf = adopt(world, mr, stream=stream)
    holder = [buf]
    del buf
    with Observer() as seen:
        before, after = drop_on_fresh_thread(world, holder)
    calls = [c for c in mr.calls if c["ptr"] == ptr]
    if not calls:
        world.drv.mem_free(ptr)
    inside = ", ".join(world.ctx(c["context"]) for c in calls) or "-"
    return {"outcome": ("deallocate ran with context %s current" % inside) if calls
            else "deallocate not called (leaked)",
            "deallocate": calls, "thread_context_after": world.ctx(after),
            "thread_context": "%s before, %s after" % (world.ctx(before), world.ctx(after)),
            "warnings": seen.messages()}


def s_mr_created_stream_contextless(world):
    return mr_buffer_dropped_contextless(world, world.stream("s"))


def s_mr_legacy_contextless(world):
    return mr_buffer_dropped_contextless(world, world.lib.get("LEGACY_DEFAULT_STREAM"))


# ---------------------------------------------------------------------------------------------
# What docs/decisions.md decides for custody: (predicate over the result, what it means).


def no_warnings(r):
    return not r.get("warnings")


def freed_on_the_legacy_stream(r):
    """On the emulator, its call log shows the free on the legacy token; a real driver shows
    no call log (then only the free and the absence of a warning are checked)."""
    call = r.get("free_call")
    return call is None or " on legacy token" in call


def deallocate_in_a(stream_label):
    def check(r):
        calls = r.get("deallocate") or []
        return (len(calls) == 1 and calls[0].get("context_label") == "A"
                and calls[0].get("stream_label") == stream_label
                and r.get("thread_context_after") == "none")
    return check


SCENARIOS = [
    ("legacy_drop", "legacy-stream pool buffer dropped on a thread with no context (section 5, 23)",
     s_legacy_drop,
     lambda r: r.get("freed") is True and r.get("thread_context_after") == "none" and no_warnings(r),
     "freed in its context, the thread left with no context, no warning (D1, D2)"),
    ("ptds_drop", "per-thread-default-stream pool buffer dropped on another thread (36)",
     s_ptds_drop,
     lambda r: r.get("freed") is True and no_warnings(r) and freed_on_the_legacy_stream(r),
     "freed on the legacy stream of its context, which waits for the recording thread's "
     "per-thread stream; no warning (D6)"),
    ("set_none", "set_deallocation_stream(None) (14)", s_set_none,
     lambda r: (r.get("exception") or "").startswith("TypeError") and r.get("buffer_closed") is False,
     "TypeError, the buffer stays open (D4)"),
    ("set_int", "set_deallocation_stream(5)", s_set_int,
     lambda r: (r.get("exception") or "").startswith("TypeError"),
     "TypeError (D4)"),
    ("set_on_closed", "set_deallocation_stream(s) on a closed buffer (17)", s_set_on_closed,
     lambda r: bool(r.get("exception")),
     "raises: the buffer is closed (D4)"),
    ("close_object_on_closed", "close(stream=object()) on a closed buffer (18)",
     s_close_object_on_closed,
     lambda r: bool(r.get("exception")),
     "raises, as set_deallocation_stream(object()) then close() would (D4)"),
    ("from_handle_contextless", "from_handle(p, n, mr=python_mr) on a thread with no context (4)",
     s_from_handle_contextless,
     lambda r: bool(r.get("exception")) and not r.get("deallocate"),
     "raises \"no CUDA context is current\"; deallocate is not called, the pointer stays the caller's (D5)"),
    ("mr_raises_drop", "dropped buffer whose mr.deallocate raises", s_mr_raises_drop,
     lambda r: not r.get("exception") and any("CUDAWarning" in w for w in r.get("warnings") or []),
     "nothing raised; a CUDAWarning reports the failure (D3)"),
    ("mr_raises_close", "close() of a buffer whose mr.deallocate raises (33)", s_mr_raises_close,
     lambda r: bool(r.get("exception")) and r.get("buffer_closed") is True,
     "close() raises the error and the buffer is closed either way (D3)"),
    ("mr_created_stream_contextless", "mr= buffer on a created stream, dropped on a thread with no context (50)",
     s_mr_created_stream_contextless, deallocate_in_a("s"),
     "deallocate runs once with the stream's context A current, given stream s; the thread is left with no context (D2)"),
    ("mr_legacy_contextless", "mr= buffer on the legacy stream, dropped on a thread with no context (50)",
     s_mr_legacy_contextless, deallocate_in_a("legacy token"),
     "deallocate runs once with the recorded context A current, given the legacy stream (D2)"),
]


def child(lib_name, scenario_id):
    """Runs one scenario (or `probe`) with one library; prints RESULT <json> last."""
    try:
        lib = Library(lib_name)
    except Exception as error:  # noqa: BLE001 - reported as the column's state
        print(RESULT_PREFIX + json.dumps({"import_error": exception_text(error)}))
        return 0
    if scenario_id == "probe":
        try:
            World(lib)
            driver = lib.driver.describe()
        except Exception as error:  # noqa: BLE001
            driver = "driver not usable: %s" % exception_text(error)
        print(RESULT_PREFIX + json.dumps({"version": lib.version, "driver": driver}))
        return 0
    scenario = next(s for s in SCENARIOS if s[0] == scenario_id)
    try:
        world = World(lib)
        result = scenario[2](world)
        for call in result.get("deallocate") or []:
            call["context_label"] = world.ctx(call["context"])
            call["stream_label"] = world.stream_name(call["stream"])
        if result.get("deallocate") is not None:
            result["deallocate_text"] = deallocate_text(world, result["deallocate"])
    except NotAvailable as missing:
        result = {"outcome": "n/a (%s)" % missing, "na": str(missing)}
    except Exception as error:  # noqa: BLE001 - a scenario that could not run
        traceback.print_exc()
        result = {"outcome": "scenario error: %s" % exception_text(error), "error": True}
    print(RESULT_PREFIX + json.dumps(result, default=str), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# The parent side: run every pair, tabulate.


def run_child(lib_name, scenario_id, timeout):
    command = [sys.executable, os.path.abspath(__file__), "--child", lib_name, scenario_id]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                             errors="replace")
    except subprocess.TimeoutExpired:
        return {"outcome": "TIMEOUT after %d s" % timeout, "error": True}
    result = None
    for line in out.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX):])
    stderr = [line for line in out.stderr.splitlines() if line.strip()]
    if result is None:
        how = "killed by signal %d" % -out.returncode if out.returncode < 0 else "exit %d" % out.returncode
        result = {"outcome": "CRASHED (%s)" % how, "error": True}
    if stderr:
        result["stderr"] = stderr
    return result


def shorten(text, limit=150):
    """`text` cut to `limit` characters for a table cell (the JSON keeps it whole)."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def cell_lines(result):
    """The facts of one result, one per line."""
    lines = [result.get("outcome", "?")]
    if result.get("free_call"):
        lines.append("free (call log): %s" % result["free_call"])
    if result.get("deallocate_text"):
        lines.append(result["deallocate_text"])
    if result.get("thread_context"):
        lines.append("thread's context: %s" % result["thread_context"])
    if "buffer_closed" in result:
        lines.append("buffer %s afterwards" % ("closed" if result["buffer_closed"] else "open"))
    for message in result.get("warnings") or []:
        lines.append("warning: %s" % shorten(message))
    stderr = result.get("stderr") or []
    for line in stderr[:3]:
        lines.append("stderr: %s" % shorten(line.strip()))
    if len(stderr) > 3:
        lines.append("stderr: ... %d more lines" % (len(stderr) - 3))
    if "verdict" in result:
        lines.append(result["verdict"])
    return lines


def render_table(rows, libs, width):
    """Rows of (scenario title, {lib: [lines]}) as a text table with wrapped cells."""
    first = 34
    col = max(30, (width - first - 3 * len(libs)) // len(libs))
    header = ["scenario".ljust(first)] + [lib.ljust(col) for lib in libs]
    out = [" | ".join(header).rstrip(), "-+-".join(["-" * first] + ["-" * col for _ in libs])]
    for title, cells in rows:
        wrapped = [textwrap.wrap(title, first)]
        for lib in libs:
            lines = []
            for item in cells[lib]:
                lines += textwrap.wrap(item, col, subsequent_indent="  ") or [""]
            wrapped.append(lines)
        height = max(len(w) for w in wrapped)
        for i in range(height):
            parts = [(wrapped[0][i] if i < len(wrapped[0]) else "").ljust(first)]
            parts += [(w[i] if i < len(w) else "").ljust(col) for w in wrapped[1:]]
            out.append(" | ".join(parts).rstrip())
        out.append("-+-".join(["-" * first] + ["-" * col for _ in libs]))
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--only", default="", help="run only scenarios whose id contains TEXT")
    parser.add_argument("--libs", default=",".join(LIBRARIES),
                        help="comma-separated libraries (default: custody,cuda.core)")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per scenario (default 120)")
    parser.add_argument("--width", type=int, default=160, help="table width (default 160)")
    parser.add_argument("--child", nargs=2, metavar=("LIB", "SCENARIO"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(*args.child)

    libs = [lib.strip() for lib in args.libs.split(",") if lib.strip()]
    unknown = [lib for lib in libs if lib not in LIBRARIES]
    if unknown:
        parser.error("unknown libraries %s (known: %s)" % (unknown, ", ".join(LIBRARIES)))

    print("custody vs cuda.core: buffer-lifetime scenarios, %s" % datetime.datetime.now().isoformat(timespec="seconds"))
    print("  host: %s, Python %s" % (platform.platform(), platform.python_version()))
    available = {}
    for lib in libs:
        probe = run_child(lib, "probe", args.timeout)
        if "import_error" in probe:
            state = "not installed" if lib == "cuda.core" else "not importable"
            available[lib] = {"available": False, "state": "%s (%s)" % (state, probe["import_error"])}
        elif probe.get("error"):
            available[lib] = {"available": False, "state": probe["outcome"]}
        else:
            available[lib] = {"available": True, "version": probe.get("version"),
                              "driver": probe.get("driver")}
        info = available[lib]
        print("  %-9s %s" % (lib + ":", "%s on %s" % (info["version"], info["driver"]) if info["available"]
                             else info["state"]))
    print()

    rows, records, unexpected = [], [], []
    for scenario_id, title, _, expect, expectation in SCENARIOS:
        if args.only not in scenario_id:
            continue
        cells, results = {}, {}
        for lib in libs:
            if not available[lib]["available"]:
                results[lib] = {"outcome": available[lib]["state"], "skipped": True}
                cells[lib] = [available[lib]["state"].split(" (")[0]]
                continue
            result = run_child(lib, scenario_id, args.timeout)
            if lib == "custody" and not result.get("na"):
                ok = not result.get("error") and expect(result)
                result["as_decided"] = ok
                result["verdict"] = ("as docs/decisions.md decides" if ok else
                                     "UNEXPECTED: docs/decisions.md decides: %s" % expectation)
                if not ok:
                    unexpected.append(scenario_id)
            results[lib] = result
            cells[lib] = cell_lines(result)
        rows.append(("%s: %s" % (scenario_id, title), cells))
        records.append({"id": scenario_id, "title": title, "custody_decision": expectation,
                        "results": results})
        print(".", end="", flush=True)
    print("\n")
    print(render_table(rows, libs, args.width))
    print()

    custody_ok = available.get("custody", {}).get("available", False)
    if "custody" not in libs:
        summary = "custody not run"
    elif not custody_ok:
        summary = "custody could not be imported: %s" % available["custody"]["state"]
    elif unexpected:
        summary = "custody: %d scenario(s) not as docs/decisions.md decides: %s" % (
            len(unexpected), ", ".join(unexpected))
    else:
        summary = "custody: every scenario as docs/decisions.md decides"
    print(summary)

    if args.json:
        document = {"when": datetime.datetime.now().isoformat(timespec="seconds"),
                    "host": platform.platform(), "python": platform.python_version(),
                    "libraries": available, "scenarios": records, "custody_unexpected": unexpected,
                    "summary": summary}
        with open(args.json, "w") as handle:
            json.dump(document, handle, indent=2, default=str)
            handle.write("\n")
        print("JSON written to %s" % args.json)

    if "custody" in libs and not custody_ok:
        return 2
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
