"""custody_outcomes: a pytest plugin that writes one JSON line per test outcome, as it happens.

Loaded by the differential harness (`foreign_tests.py`) with `-p custody_outcomes`; writes to the
file named by CUSTODY_OUTCOMES_FILE. Each line is flushed at once, so a test that kills the
process (a crash in a driver) still leaves a "start" line without an outcome: the harness reports
it as a crash instead of losing the whole file.

Lines: {"event": "start", "nodeid": ...} when a test begins; {"event": "outcome", "nodeid": ...,
"outcome": passed|failed|error|skipped|xfailed|xpassed, "message": ...} when its teardown ends;
{"event": "outcome", "nodeid": <file>, "outcome": "error", "collect": true, ...} for a file that
fails to collect.

Each outcome also carries "calls": what the test (its setup, call and teardown) used that the
differential harness classes tests by (`foreign_tests.py`, "scope"), sorted and deduplicated:
- "driver:NAME" for every driver entry point the emulator does not serve that the test called,
  in this process or in a child process (read from the file the emulator appends to when
  CUSTODY_EMU_UNSUPPORTED_LOG names one; `driver:cuGetExportTable` is how the CUDA runtime's
  start shows there);
- "runtime:NAME", "nvrtc:NAME", "nvml:NAME", ... for every call through the Python modules of
  cuda-bindings other than the driver's (`cuda.bindings.runtime`, `.nvrtc`, `.nvml`, `.nvvm`,
  `.nvjitlink`, `.nvfatbin`) made in this process: their public functions are wrapped, on
  both drivers, by a pass-through that notes the name (that is how cuda.core 1.2 calls them:
  `runtime.cudaDeviceSynchronize()` on the module);
- "library:NAME" for every library other than the driver asked of
  `cuda.pathfinder.load_nvidia_dynamic_lib` (NVRTC, NVVM, nvJitLink, NVML, ...).
Nothing is recorded, and nothing wrapped, when those modules are not installed.
"""

import functools
import json
import os
import sys

_FILE = None
_PHASES = {}

# The Python modules of cuda-bindings whose calls are noted, with the prefix noted for each.
_BINDINGS = {
    "cuda.bindings.runtime": "runtime",
    "cuda.bindings.nvrtc": "nvrtc",
    "cuda.bindings.nvml": "nvml",
    "cuda.bindings.nvvm": "nvvm",
    "cuda.bindings.nvjitlink": "nvjitlink",
    "cuda.bindings.nvfatbin": "nvfatbin",
}
_WRAPPED = set()
_CALLS = set()
_LOG_START = {}


def _note(name):
    _CALLS.add(name)


def _wrap_function(prefix, name, function):
    @functools.wraps(function)
    def noted(*args, **kwargs):
        _note("%s:%s" % (prefix, name))
        return function(*args, **kwargs)

    noted.__custody_noted__ = True
    return noted


def _wrap_loaded_modules():
    """Wraps the public functions of the binding modules imported so far (once each)."""
    for module_name, prefix in _BINDINGS.items():
        module = sys.modules.get(module_name)
        if module is None or module_name in _WRAPPED:
            continue
        _WRAPPED.add(module_name)
        for name in dir(module):
            if name.startswith("_"):
                continue
            value = getattr(module, name, None)
            if isinstance(value, type) or not callable(value) or getattr(value, "__custody_noted__", False):
                continue
            try:
                setattr(module, name, _wrap_function(prefix, name, value))
            except (AttributeError, TypeError):
                pass
    pathfinder = sys.modules.get("cuda.pathfinder")
    if pathfinder is not None and "cuda.pathfinder" not in _WRAPPED:
        _WRAPPED.add("cuda.pathfinder")
        load = getattr(pathfinder, "load_nvidia_dynamic_lib", None)
        if load is not None and not getattr(load, "__custody_noted__", False):
            @functools.wraps(load)
            def noted_load(libname, *args, **kwargs):
                if libname != "cuda":
                    _note("library:%s" % libname)
                return load(libname, *args, **kwargs)

            noted_load.__custody_noted__ = True
            pathfinder.load_nvidia_dynamic_lib = noted_load


def _log_size():
    path = os.environ.get("CUSTODY_EMU_UNSUPPORTED_LOG")
    if not path:
        return None
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _unsupported_since(offset):
    """The entry point names in the emulator's unsupported-call log after byte `offset`."""
    path = os.environ.get("CUSTODY_EMU_UNSUPPORTED_LOG")
    if not path or offset is None:
        return set()
    try:
        with open(path, "rb") as log:
            log.seek(offset)
            text = log.read().decode("utf-8", "replace")
    except OSError:
        return set()
    names = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            names.add("driver:%s" % parts[1])
    return names


def _write(record):
    global _FILE
    path = os.environ.get("CUSTODY_OUTCOMES_FILE")
    if not path:
        return
    if _FILE is None:
        _FILE = open(path, "a", encoding="utf-8")
    _FILE.write(json.dumps(record) + "\n")
    _FILE.flush()


def _message(report):
    text = getattr(report, "longreprtext", "") or ""
    if report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        text = str(report.longrepr[2])
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E ")]
    line = errors[-1] if errors else (lines[-1] if lines else "")
    return line[:300]


def _wrap_pathfinder_early():
    """Wraps cuda.pathfinder's loader before any test code imports it: cuda-bindings' NVRTC,
    NVVM, nvJitLink and NVML modules take their own reference to it when they are first
    imported (by a conftest.py, before any pytest hook of this plugin runs)."""
    try:
        import cuda.pathfinder  # noqa: F401  (pure Python; loads no library)
    except Exception:
        return
    _wrap_loaded_modules()


_wrap_pathfinder_early()


def pytest_configure(config):
    _wrap_loaded_modules()


def pytest_collection_finish(session):
    _wrap_loaded_modules()


def pytest_runtest_logstart(nodeid, location):
    _wrap_loaded_modules()
    _CALLS.clear()
    _LOG_START[nodeid] = _log_size()
    _write({"event": "start", "nodeid": nodeid})


def pytest_runtest_logreport(report):
    phases = _PHASES.setdefault(report.nodeid, {})
    phases[report.when] = report
    if report.when != "teardown":
        return
    del _PHASES[report.nodeid]
    setup, call, teardown = phases.get("setup"), phases.get("call"), report
    xfail = any(hasattr(r, "wasxfail") for r in (setup, call) if r is not None)
    if setup is not None and setup.failed:
        outcome, why = "error", setup
    elif setup is not None and setup.skipped:
        outcome, why = ("xfailed" if xfail else "skipped"), setup
    elif call is not None and call.failed:
        outcome, why = "failed", call
    elif call is not None and call.skipped:
        outcome, why = ("xfailed" if xfail else "skipped"), call
    elif call is not None and xfail:
        outcome, why = "xpassed", call
    else:
        outcome, why = "passed", call
    if teardown.failed and outcome in ("passed", "skipped", "xfailed", "xpassed"):
        outcome, why = "error", teardown
    calls = set(_CALLS) | _unsupported_since(_LOG_START.pop(report.nodeid, None))
    _CALLS.clear()
    _write({"event": "outcome", "nodeid": report.nodeid, "outcome": outcome,
            "message": _message(why) if why is not None and outcome != "passed" else "",
            "calls": sorted(calls)})


def pytest_collectreport(report):
    if report.failed:
        _write({"event": "outcome", "nodeid": report.nodeid, "outcome": "error", "collect": True,
                "message": _message(report)})
