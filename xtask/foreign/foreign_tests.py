#!/usr/bin/env python3
"""Differential harness: a pytest tree run on custody's emulated driver and on a real one.

Runs each test file of a pytest tree (NVIDIA's cuda.core test suite, or any program's tests that
reach the CUDA driver through `libcuda.so.1`) twice with a given Python environment: once with
the emulator standing in for `libcuda.so.1` (a folder holding `libcuda.so.1 -> libcuda_emu.so`
first on LD_LIBRARY_PATH, and CUSTODY_CUDA_DRIVER pointing at it), once on the real driver (the
system's `libcuda.so.1`, or --real-driver PATH). It prints, per test, both outcomes and whether
they agree, then per-file counts, and writes results.json and results.md to --out.

Instead of running on a real driver here, --real-results DIR compares against outcomes recorded
elsewhere: JUnit XML files (pytest --junitxml) or this harness's own results.json.

Outcomes: passed, failed, error (setup, teardown or collection failed), skipped, xfailed,
xpassed, crash (the process died during the test), timeout, missing (not run on that side).
Two outcomes agree when they are equal, with failed and error counted as one ("fails").

Scope: every test is classed in or out of scope by what it used on the emulator (SCOPE_RULES):
the plugin records, per test, the driver entry points the emulator does not serve that the
test called (the emulator appends each such call to the file CUSTODY_EMU_UNSUPPORTED_LOG
names, child processes included), its calls through cuda-bindings' non-driver modules
(runtime, NVRTC, NVML, ...) and the NVIDIA libraries it asked cuda.pathfinder for. A test is
out of scope when one of those belongs to a family the emulator does not emulate by design:
the CUDA runtime, kernels (NVRTC, NVVM, nvJitLink, modules, libraries, launches), NVML, virtual
memory management. Everything else is in scope, unsupported calls of other families included
(they are emulator gaps, and the report lists them). The report gives agreement over the
in-scope tests and over all, per file and in total, and the reason for every test out of scope.

Each file runs in its own pytest process (a crash or a hang costs one file, not the run), with
a plugin (custody_outcomes.py, beside this file) that writes every outcome as it happens. Needs
only Python 3.9+ and its standard library; the tests' Python (--python, or --venv, which this
script creates and fills with --install packages when it lacks them) needs pytest.

  python3 foreign_tests.py --tests DIR --emulator LIB [--python PY | --venv DIR] [--out DIR]
        [--real-driver PATH | --no-real-driver | --real-results DIR] [--timeout S]
        [--emu-devices N] [--preset NAME] [PATH ...]

PATH: test files or folders relative to --tests (default: every test_*.py under it, or
--preset's list). Exit status: 0 when the run completed (whatever the tests did), 1 when the
agreement is below --min-agreement, 2 on a usage error.
"""

import argparse
import ctypes
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent

# cuda.core's tests of what the emulator serves: memory, streams, events, the graph memory
# resource, the graph builder, IPC and error handling; "cuda-core-next" adds devices, contexts
# and the object protocols (hashing, equality, pickling, repr).
PRESETS = {
    "cuda-core": [
        "test_memory.py", "memory", "memory_ipc", "test_stream.py", "test_event.py",
        "graph/test_graph_memory_resource.py", "graph/test_graph_builder.py",
        "test_managed_memory_warning.py", "test_cuda_utils.py", "test_utils_enum_explanations_helpers.py",
    ],
    "cuda-core-next": ["test_device.py", "test_context.py", "test_object_protocols.py"],
}
PRESETS["cuda-core-all"] = PRESETS["cuda-core"] + PRESETS["cuda-core-next"]

# What --venv installs when the environment cannot import them: NVIDIA's cuda.core 1.2 with the
# CUDA 13 bindings (the GPU host's versions), numpy and pytest, and what cuda.core's tests use
# when present (cloudpickle: the pickling tests; psutil: the IPC leak tests), so that they run
# instead of skipping.
DEFAULT_INSTALL = ["cuda-core==1.2.0", "cuda-bindings==13.3.*", "numpy", "pytest", "cloudpickle", "psutil"]

FAILS = ("failed", "error")

# What the emulator does not emulate by design (docs/testing.md, "Foreign clients"): a test that
# used any of these on the emulator is out of scope. Each rule: (reason, predicate on one
# recorded call: "driver:NAME", "runtime:NAME", "nvml:NAME", "library:NAME", ...).
_KERNEL_DRIVER_PREFIXES = ("cuModule", "cuLibrary", "cuKernel", "cuFunc", "cuLaunch", "cuLink",
                           "cuOccupancy", "cuTensorMap")
_VMM_DRIVER_NAMES = ("cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemMapArrayAsync", "cuMemUnmap",
                     "cuMemAddressReserve", "cuMemAddressFree", "cuMemSetAccess", "cuMemGetAccess",
                     "cuMemExportToShareableHandle", "cuMemImportFromShareableHandle",
                     "cuMemGetAllocationGranularity", "cuMemGetAllocationPropertiesFromHandle",
                     "cuMemRetainAllocationHandle", "cuMemGetHandleForAddressRange")


def _driver(call):
    name = call.split(":", 1)[1] if call.startswith("driver:") else None
    return name.split("_v")[0] if name else None


SCOPE_RULES = [
    ("needs the CUDA runtime (cudart, which starts through the driver's private export tables)",
     lambda c: c.startswith("runtime:") or c == "library:cudart" or _driver(c) == "cuGetExportTable"),
    ("kernels (NVRTC, NVVM, nvJitLink, modules, libraries, launches)",
     lambda c: c.split(":", 1)[0] in ("nvrtc", "nvvm", "nvjitlink", "nvfatbin")
     or c in ("library:nvrtc", "library:nvvm", "library:nvJitLink", "library:nvfatbin")
     or (_driver(c) or "").startswith(_KERNEL_DRIVER_PREFIXES)),
    ("NVML (system management)", lambda c: c.startswith("nvml:") or c == "library:nvml"),
    ("virtual memory management", lambda c: (_driver(c) or "") in _VMM_DRIVER_NAMES
     or (_driver(c) or "").startswith("cuMulticast")),
]


# Tests that stop before reaching any library because what a kernel needs is missing from the
# machine: (reason, text of the skip message). cuda.core's kernel helpers skip when no CUDA
# headers are installed (where they are, the test compiles its kernel and calls the driver's
# module entry points, which the rules above class).
SKIP_RULES = [
    ("kernels (NVRTC, NVVM, nvJitLink, modules, libraries, launches)", "need CUDA header"),
]


def scope_of(calls, outcome=None):
    """(in scope?, reason): out of scope when a recorded call falls under one of SCOPE_RULES, or
    the test skipped for a reason in SKIP_RULES."""
    if outcome and outcome.get("outcome") == "skipped":
        for reason, text in SKIP_RULES:
            if text in outcome.get("message", ""):
                return False, "%s: skipped (%s)" % (reason, text)
    for reason, rule in SCOPE_RULES:
        hits = sorted(c for c in calls if rule(c))
        if hits:
            shown = ", ".join(hits[:3]) + (", ..." if len(hits) > 3 else "")
            return False, "%s: %s" % (reason, shown)
    unsupported = sorted(c for c in calls if c.startswith("driver:"))
    if unsupported:
        return True, "in scope; called entry points the emulator does not serve: %s" % ", ".join(unsupported)
    return True, ""


def coarse(outcome):
    return "fails" if outcome in FAILS else outcome


# ---------------------------------------------------------------------------------------------
# Drivers


def probe_driver(name):
    """Loads a driver library with ctypes and asks it who it is: {loaded, path, version, devices
    (their names), emulated, error}. The GPU runner (``run.py``) probes its drivers with it too."""
    info = {"loaded": False, "path": str(name), "version": None, "devices": [],
            "emulated": False, "error": None}
    try:
        lib = ctypes.CDLL(str(name))
    except OSError as error:
        info["error"] = str(error)
        return info
    info["loaded"] = True
    info["emulated"] = hasattr(lib, "custodyEmuVersion")
    try:
        version = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
            info["version"] = version.value
        status = lib.cuInit(0)
        if status != 0:
            info["error"] = "cuInit returned %d" % status
            return info
        count = ctypes.c_int(0)
        if lib.cuDeviceGetCount(ctypes.byref(count)) == 0:
            for ordinal in range(count.value):
                device = ctypes.c_int(0)
                buf = ctypes.create_string_buffer(256)
                if lib.cuDeviceGet(ctypes.byref(device), ordinal) == 0 and \
                        lib.cuDeviceGetName(buf, 256, device) == 0:
                    info["devices"].append(buf.value.decode(errors="replace"))
    except AttributeError as error:  # a library that is not a CUDA driver
        info["error"] = "not a CUDA driver: %s" % error
    return info


def probe_in_child(name, env=None):
    """probe_driver in a fresh process (so that this process never loads a driver)."""
    code = ("import json, sys; sys.path.insert(0, %r); import foreign_tests as f; "
            "print(json.dumps(f.probe_driver(%r)))" % (str(HERE), str(name)))
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, env=env)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired) as error:
        return {"loaded": False, "path": str(name), "version": None, "devices": [],
                "emulated": False, "error": "probe failed: %s" % error}


def library_folder(library, where):
    """A folder holding `libcuda.so.1` -> `library`, for LD_LIBRARY_PATH."""
    folder = Path(where)
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "libcuda.so.1"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(Path(library).resolve())
    return folder


def driver_env(base, folder, library, devices=None):
    env = dict(base)
    env.pop("CUSTODY_CUDA_DRIVER", None)
    env.pop("CUSTODY_EMU_DEVICE_COUNT", None)
    if folder is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(folder), base.get("LD_LIBRARY_PATH")]))
        env["CUSTODY_CUDA_DRIVER"] = str(Path(library).resolve())
    if devices is not None:
        env["CUSTODY_EMU_DEVICE_COUNT"] = str(devices)
    return env


# ---------------------------------------------------------------------------------------------
# The tests' Python


def ensure_venv(venv, install):
    """The interpreter of `venv`, created and filled with `install` when it cannot import them."""
    venv = Path(venv)
    python = venv / "bin" / "python"
    if not python.is_file():
        print("foreign-tests: creating %s" % venv, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    probe = "import cuda.core, pytest, numpy, cloudpickle, psutil"
    if subprocess.run([str(python), "-c", probe], capture_output=True).returncode != 0:
        print("foreign-tests: installing %s into %s" % (" ".join(install), venv), flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet"] + install, check=True)
    return python


def python_versions(python, env):
    code = ("import json, platform\n"
            "from importlib import metadata\n"
            "v = {'python': platform.python_version()}\n"
            "for p in ('cuda-core', 'cuda-bindings', 'pytest', 'numpy'):\n"
            "    try: v[p] = metadata.version(p)\n"
            "    except Exception: v[p] = None\n"
            "print(json.dumps(v))")
    try:
        out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env,
                             timeout=120)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired) as error:
        return {"error": str(error)}


# ---------------------------------------------------------------------------------------------
# Running one file


def test_files(tests, paths):
    """The test files to run, relative to `tests`, in order."""
    out = []
    for path in paths or ["."]:
        full = (tests / path).resolve()
        if full.is_dir():
            out.extend(sorted(str(p.relative_to(tests)) for p in full.rglob("test_*.py")
                              if "__pycache__" not in p.parts))
        elif full.is_file():
            out.append(str(full.relative_to(tests)))
        else:
            raise SystemExit("foreign-tests: %s does not exist under %s" % (path, tests))
    seen = set()
    return [f for f in out if not (f in seen or seen.add(f))]


def run_file(python, tests, rel, env, timeout, out_dir, column):
    """Runs pytest on one file; returns ({nodeid: {outcome, message}}, info)."""
    slug = rel.replace("/", "__")
    outcomes_file = out_dir / column / (slug + ".jsonl")
    log_file = out_dir / column / (slug + ".log")
    outcomes_file.parent.mkdir(parents=True, exist_ok=True)
    if outcomes_file.exists():
        outcomes_file.unlink()
    env = dict(env)
    env["CUSTODY_OUTCOMES_FILE"] = str(outcomes_file)
    if column == "emulator":
        unsupported_log = out_dir / column / (slug + ".unsupported.log")
        if unsupported_log.exists():
            unsupported_log.unlink()
        env["CUSTODY_EMU_UNSUPPORTED_LOG"] = str(unsupported_log)
    else:
        env.pop("CUSTODY_EMU_UNSUPPORTED_LOG", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONFAULTHANDLER", "1")
    command = [str(python), "-m", "pytest", "-p", "custody_outcomes", "-p", "no:cacheprovider",
               "--continue-on-collection-errors", "-q", "-rN", "-W", "ignore::pytest.PytestUnknownMarkWarning",
               "--junitxml", str(out_dir / column / (slug + ".xml")), rel]
    started = time.monotonic()
    status = "done"
    with open(log_file, "w", encoding="utf-8", errors="replace") as log:
        process = subprocess.Popen(command, cwd=str(tests), env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            status = "timeout"
            with_children_killed(process)
            rc = None
    if rc is not None and rc < 0:
        status = "crash"
    results, running = read_outcomes(outcomes_file)
    for nodeid in running:
        results[nodeid] = {"outcome": "timeout" if status == "timeout" else "crash",
                           "message": "the pytest process %s during this test" %
                           ("was killed after %d s" % timeout if status == "timeout" else
                            "died (exit status %s)" % rc)}
    if not results and status == "done" and rc not in (0, 1, 5):
        results[rel] = {"outcome": "error", "message": "pytest exited %s (see %s)" % (rc, log_file)}
    info = {"rc": rc, "status": status, "seconds": round(time.monotonic() - started, 1),
            "log": str(log_file)}
    return results, info


def with_children_killed(process):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def read_outcomes(path):
    """({nodeid: {outcome, message}}, [nodeids started without an outcome])."""
    results, started = {}, []
    if not path.exists():
        return results, started
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == "start":
            started.append(record["nodeid"])
        elif record.get("event") == "outcome":
            results[record["nodeid"]] = {"outcome": record["outcome"],
                                         "message": record.get("message", ""),
                                         "calls": record.get("calls", [])}
    return results, [n for n in started if n not in results]


# ---------------------------------------------------------------------------------------------
# Recorded results (JUnit XML or results.json)


def junit_key(classname, name):
    return "%s::%s" % (classname, name)


def nodeid_key(nodeid):
    """A pytest node id as JUnit names it: (classname, name) joined, e.g. graph.test_x.TestC::t[p]."""
    parts = nodeid.split("::")
    path = parts[0]
    module = path[:-3] if path.endswith(".py") else path
    module = module.replace("/", ".")
    if len(parts) == 1:  # a file that failed to collect
        return junit_key("", module)
    return junit_key(".".join([module] + parts[1:-1]), parts[-1])


def load_recorded(folder):
    """{junit key: {outcome, message}} from JUnit XML files or results.json under `folder`."""
    folder = Path(folder)
    recorded = {}
    for path in sorted(folder.rglob("results.json")):
        data = json.loads(path.read_text())
        for row in data.get("tests", []):
            result = row.get("real") or {}
            if result.get("outcome") not in (None, "missing"):
                recorded[nodeid_key(row["nodeid"])] = result
    for path in sorted(folder.rglob("*.xml")):
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError:
            continue
        for case in root.iter("testcase"):
            outcome, message = "passed", ""
            for child in case:
                tag = child.tag
                text = (child.get("message") or "").strip().splitlines()
                text = text[-1][:300] if text else ""
                if tag == "failure":
                    outcome, message = "failed", text
                elif tag == "error":
                    # pytest writes a teardown error as a second <error> next to a pass.
                    outcome, message = "error", text
                elif tag == "skipped":
                    outcome = "xfailed" if child.get("type") == "pytest.xfail" else "skipped"
                    message = text
            key = junit_key(case.get("classname", ""), case.get("name", ""))
            if key in recorded and recorded[key]["outcome"] in FAILS:
                continue
            recorded[key] = {"outcome": outcome, "message": message}
    return recorded


def match_recorded(recorded, key):
    """Finds `key` in recorded results whose classnames may carry extra leading packages."""
    if key in recorded:
        return recorded[key]
    for candidate, result in recorded.items():
        if candidate.endswith("." + key) or (key.startswith("::") and candidate.endswith("." + key[2:])):
            return result
    return None


# ---------------------------------------------------------------------------------------------
# Report


def agree(a, b):
    return coarse(a) == coarse(b)


def _tally(rows):
    """(compared, agree, in-scope compared, in-scope agree) over `rows`."""
    both = [r for r in rows if r["emulator"]["outcome"] != "missing" and r["real"]["outcome"] != "missing"]
    inside = [r for r in both if r["scope"]["in"]]
    return (len(both), sum(1 for r in both if r["agree"]), len(inside), sum(1 for r in inside if r["agree"]))


def _percent(part, whole):
    return (100.0 * part / whole) if whole else None


def _totals(rows):
    compared, agreed, in_compared, in_agreed = _tally(rows)
    return {"tests": len(rows), "compared": compared, "agree": agreed,
            "agreement": _percent(agreed, compared),
            "in_scope": sum(1 for r in rows if r["scope"]["in"]),
            "in_scope_compared": in_compared, "in_scope_agree": in_agreed,
            "in_scope_agreement": _percent(in_agreed, in_compared)}


def summarise(rows, files, groups):
    """Per-file entries, totals over everything, and totals per named group of files."""
    per_file = []
    for rel in files:
        mine = [r for r in rows if r["file"] == rel]
        entry = {"file": rel, "tests": len(mine)}
        for column in ("emulator", "real"):
            counts = {}
            for r in mine:
                o = r[column]["outcome"]
                counts[o] = counts.get(o, 0) + 1
            entry[column] = counts
        entry.update({k: v for k, v in _totals(mine).items() if k != "tests"})
        per_file.append(entry)
    by_group = {}
    for name, members in groups.items():
        mine = [r for r in rows if r["file"] in members]
        if mine:
            by_group[name] = dict(_totals(mine), files=sorted(set(r["file"] for r in mine)))
    return per_file, _totals(rows), by_group


def counts_text(counts):
    order = ["passed", "failed", "error", "skipped", "xfailed", "xpassed", "crash", "timeout", "missing"]
    return ", ".join("%d %s" % (counts[o], o) for o in order if counts.get(o))


def ratio(part, whole):
    return "%d/%d" % (part, whole) if whole else "-"


def totals_line(label, t):
    if not t["compared"]:
        return "%s: nothing compared (no real-driver outcomes)" % label
    return ("%s: in scope %d of %d compared tests agree (%s); all %d of %d (%.1f%%); %d of %d tests in scope"
            % (label, t["in_scope_agree"], t["in_scope_compared"],
               "%.1f%%" % t["in_scope_agreement"] if t["in_scope_agreement"] is not None else "-",
               t["agree"], t["compared"], t["agreement"], t["in_scope"], t["tests"]))


def write_reports(out_dir, meta, rows, per_file, totals, groups):
    data = dict(meta)
    data.update({"scope_rules": [reason for reason, _ in SCOPE_RULES], "files": per_file,
                 "totals": totals, "groups": groups, "tests": rows})
    (out_dir / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    lines = ["# Differential run: %s" % meta["tests_dir"], "",
             "- when: %s" % meta["when"],
             "- python: %s" % json.dumps(meta["python_versions"]),
             "- emulator: %s (%s devices)" % (meta["emulator"]["path"], meta["emulator_devices"]),
             "- real driver: %s" % meta["real_description"], "",
             "Out of scope (a test that used one of these on the emulator): %s." %
             "; ".join(reason for reason, _ in SCOPE_RULES), "",
             "| file | tests | emulator | real driver | in scope | agree in scope | agree all |",
             "|---|---|---|---|---|---|---|"]
    for f in per_file:
        lines.append("| %s | %d | %s | %s | %d | %s | %s |" % (
            f["file"], f["tests"], counts_text(f["emulator"]), counts_text(f["real"]), f["in_scope"],
            ratio(f["in_scope_agree"], f["in_scope_compared"]), ratio(f["agree"], f["compared"])))
    lines.append("")
    for name, t in sorted(groups.items()):
        lines.append("- " + totals_line("preset %s" % name, t))
    lines.append("- " + totals_line("everything run", totals))
    disagreements = [r for r in rows if not r["agree"] and r["real"]["outcome"] != "missing"
                     and r["emulator"]["outcome"] != "missing"]
    for title, chosen in (("in scope", [r for r in disagreements if r["scope"]["in"]]),
                          ("out of scope", [r for r in disagreements if not r["scope"]["in"]])):
        if not chosen:
            continue
        lines += ["", "## Disagreements %s (%d)" % (title, len(chosen)), "",
                  "| test | emulator | real driver | emulator says | scope |", "|---|---|---|---|---|"]
        for r in chosen:
            lines.append("| %s | %s | %s | %s | %s |" % (
                r["nodeid"], r["emulator"]["outcome"], r["real"]["outcome"],
                r["emulator"].get("message", "").replace("|", "\\|"), r["scope"]["reason"].replace("|", "\\|")))
    agreeing_out = [r for r in rows if r["agree"] and not r["scope"]["in"]]
    if agreeing_out:
        lines += ["", "## Out of scope, agreeing anyway (%d)" % len(agreeing_out), "",
                  "| test | outcome | scope |", "|---|---|---|"]
        for r in agreeing_out:
            lines.append("| %s | %s | %s |" % (r["nodeid"], r["emulator"]["outcome"], r["scope"]["reason"]))
    (out_dir / "results.md").write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", required=True, help="the pytest tree (its conftest.py's folder)")
    parser.add_argument("--emulator", required=True, help="libcuda_emu.so")
    parser.add_argument("--python", help="the interpreter that runs pytest (default: this one)")
    parser.add_argument("--venv", help="a virtual environment to use, created and filled when needed")
    parser.add_argument("--install", nargs="*", default=DEFAULT_INSTALL,
                        help="what --venv installs (default: %s)" % " ".join(DEFAULT_INSTALL))
    parser.add_argument("--out", default="foreign-results", help="where results go")
    parser.add_argument("--real-driver", help="library to use as the real driver (default: libcuda.so.1)")
    parser.add_argument("--no-real-driver", action="store_true", help="run on the emulator only")
    parser.add_argument("--real-results", help="compare with recorded outcomes (JUnit XML or results.json)")
    parser.add_argument("--emu-devices", type=int,
                        help="devices the emulator shows (default: as many as the real driver, else 1)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per file and driver (default 900)")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="a named list of paths")
    parser.add_argument("--min-agreement", type=float,
                        help="exit 1 when the in-scope agreement is below this percentage")
    parser.add_argument("--quiet", action="store_true", help="print only the tests that disagree or were not compared")
    parser.add_argument("paths", nargs="*", help="files or folders under --tests")
    args = parser.parse_args(argv)

    tests = Path(args.tests).resolve()
    if not tests.is_dir():
        parser.error("--tests %s is not a folder" % tests)
    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    emulator_lib = Path(args.emulator).resolve()
    if not emulator_lib.is_file():
        parser.error("--emulator %s does not exist" % emulator_lib)
    if args.venv:
        python = ensure_venv(args.venv, args.install)
    else:
        python = Path(args.python) if args.python else Path(sys.executable)
    paths = list(args.paths) + (PRESETS[args.preset] if args.preset else [])
    files = test_files(tests, paths)

    work = Path(tempfile.mkdtemp(prefix="custody-foreign-"))
    try:
        emu_folder = library_folder(emulator_lib, work / "emulator")
        emulator = probe_in_child(emulator_lib)
        recorded = None
        real, real_folder, real_lib = None, None, None
        if args.real_results:
            recorded = load_recorded(args.real_results)
            real_description = "recorded outcomes from %s (%d tests)" % (args.real_results, len(recorded))
        elif args.no_real_driver:
            real_description = "not run (--no-real-driver)"
        else:
            real_lib = Path(args.real_driver).resolve() if args.real_driver else "libcuda.so.1"
            real_env = os.environ
            if args.real_driver:
                real_folder = library_folder(real_lib, work / "real")
                real_env = driver_env(os.environ, real_folder, real_lib)
            real = probe_in_child(real_lib, real_env)
            if not real["loaded"] or real["error"] or not real["devices"]:
                real_description = "NOT RUN: %s could not be used (%s)" % (
                    real["path"], real["error"] or "no CUDA device")
                real = None
            elif real["emulated"] and not args.real_driver:
                real_description = "NOT RUN: the system's libcuda.so.1 is custody's emulator"
                real = None
            else:
                real_description = "%s, CUDA %s, %d device(s)%s" % (
                    real["path"], real["version"], len(real["devices"]),
                    " (custody's emulator)" if real["emulated"] else "")
        devices = args.emu_devices or (len(real["devices"]) if real else 1)
        emu_env = driver_env(os.environ, emu_folder, emulator_lib, devices)
        meta = {
            "when": datetime.datetime.now().isoformat(timespec="seconds"),
            "host": platform.platform(),
            "tests_dir": str(tests),
            "python": str(python),
            "python_versions": python_versions(python, emu_env),
            "emulator": emulator,
            "emulator_devices": devices,
            "real_driver": real,
            "real_description": real_description,
            "files_run": files,
        }
        print("foreign-tests: %d file(s) under %s" % (len(files), tests))
        print("  python:    %s %s" % (python, json.dumps(meta["python_versions"])))
        print("  emulator:  %s, CUDA %s, %d device(s)" % (emulator_lib, emulator.get("version"), devices))
        print("  real:      %s" % real_description, flush=True)

        rows, runs = [], []
        for rel in files:
            emu_results, emu_info = run_file(python, tests, rel, emu_env, args.timeout, out_dir, "emulator")
            if real is not None:
                real_env = driver_env(os.environ, real_folder, real_lib) if real_folder else driver_env(os.environ, None, None)
                real_results, real_info = run_file(python, tests, rel, real_env, args.timeout, out_dir, "real")
            else:
                real_results, real_info = {}, None
            runs.append({"file": rel, "emulator": emu_info, "real": real_info})
            nodeids = list(emu_results) + [n for n in real_results if n not in emu_results]
            if recorded is not None:
                real_results = {}
                for n in nodeids:
                    found = match_recorded(recorded, nodeid_key(n))
                    if found is not None:
                        real_results[n] = found
            print("\n%s" % rel)
            for n in nodeids:
                e = emu_results.get(n, {"outcome": "missing", "message": ""})
                r = real_results.get(n, {"outcome": "missing", "message": ""})
                same = agree(e["outcome"], r["outcome"])
                inside, reason = scope_of(e.get("calls", []), e)
                rows.append({"file": rel, "nodeid": n, "emulator": e, "real": r, "agree": same,
                             "scope": {"in": inside, "reason": reason}})
                compared = "missing" not in (e["outcome"], r["outcome"])
                mark = ("agree" if same else "DIFFER") if compared else "-"
                if not (args.quiet and same):
                    print("  %-8s %-8s %-6s %-3s %s" % (e["outcome"], r["outcome"], mark,
                                                         "in" if inside else "out", n))
                    if reason:
                        print("           scope: %s" % reason)
                if compared and not same and e.get("message"):
                    print("           emulator: %s" % e["message"])
            print("  [%s] emulator: %s" % (rel, emu_info["status"]), flush=True)
        meta["runs"] = runs
        groups = {name: set(test_files(tests, [p for p in paths_of if (tests / p).exists()]))
                  for name, paths_of in PRESETS.items()
                  if not name.endswith("-all") and any((tests / p).exists() for p in paths_of)}
        per_file, totals, by_group = summarise(rows, files, groups)
        write_reports(out_dir, meta, rows, per_file, totals, by_group)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print("\n%-42s %5s  %-34s %-34s %5s %9s %9s" % ("file", "tests", "emulator", "real driver", "in",
                                                    "agree-in", "agree-all"))
    for f in per_file:
        print("%-42s %5d  %-34s %-34s %5d %9s %9s" % (
            f["file"], f["tests"], counts_text(f["emulator"]), counts_text(f["real"]), f["in_scope"],
            ratio(f["in_scope_agree"], f["in_scope_compared"]), ratio(f["agree"], f["compared"])))
    print()
    for name, t in sorted(by_group.items()):
        print(totals_line("preset %s" % name, t))
    print(totals_line("everything run", totals))
    if totals["agreement"] is None:
        print("no real-driver outcomes: %s" % real_description)
    print("results in %s (results.md, results.json, emulator/, real/)" % out_dir)
    if args.min_agreement is not None and (totals["in_scope_agreement"] or 0.0) < args.min_agreement:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
