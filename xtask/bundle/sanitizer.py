"""NVIDIA compute-sanitizer for the GPU runner (run.py --sanitizer): where the host has it, the
command line each tool runs a program under, and what a tool's log says (docs/testing.md,
"Under compute-sanitizer").

Standard library only, like run.py. `python3 sanitizer.py --self-test` checks the parser against
recorded output of each kind of report (the same check `cargo xtask test` runs, from
xtask/tests/bundle_runner.rs).
"""

import glob
import os
import re
import shutil
import subprocess
import sys

# The tools run, and their options. memcheck checks every program: device memory accesses, the
# stream-ordered allocator's lifetimes (use before allocation, use after free, across streams)
# and, after the program's last free, what it left allocated. CUDA API errors are not reported:
# the tests make failing driver calls on purpose (bad input, the conformance suite's error
# codes), and assert each one's result themselves. racecheck and synccheck check the shared
# memory and barriers of kernels, so they run only on the programs that launch one.
MEMCHECK = ["--tool", "memcheck", "--track-stream-ordered-races", "all", "--leak-check", "full",
            "--report-api-errors", "no"]
RACECHECK = ["--tool", "racecheck", "--racecheck-report", "analysis"]
SYNCCHECK = ["--tool", "synccheck"]
TOOLS = {"memcheck": MEMCHECK, "racecheck": RACECHECK, "synccheck": SYNCCHECK}
# Options for every tool: follow child processes (IPC tests spawn some), do not fail a program
# that never initialises CUDA (unit tests that make no driver call), wait for slow starters
# (a Python process imports its packages before its first driver call; the runner's own
# per-test limit bounds the run), ignore cuGetProcAddress probing a name it does not know.
COMMON = ["--target-processes", "all", "--require-cuda-init", "no", "--launch-timeout", "0",
          "--ignore-getprocaddress-notfound"]

# What every line of a tool's report starts with (its default --prefix).
_LINE = re.compile(r"^\s*========= ?(.*)$")
_SUMMARIES = {
    "errors": re.compile(r"^ERROR SUMMARY: (\d+) errors?"),
    "leaked": re.compile(r"^LEAK SUMMARY: (\d+) bytes leaked in (\d+) allocations?"),
    "hazards": re.compile(r"^RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)"),
}
# A report's first line, by kind (the first that matches). Lines below a report's first are
# indented; a bare prefix line ends it.
_KINDS = [
    ("api error", re.compile(r"^Program hit ")),
    ("leak", re.compile(r"^Leaked [\d,]+ bytes")),
    ("stream-ordered race", re.compile(r"^[A-Z][a-z]+-(before-alloc|after-free|after-alloc)\b")),
    ("memory access", re.compile(r"^(Potential )?[Ii]nvalid __(global|shared|local)__ ")),
    ("device heap", re.compile(r"^Malloc/Free error")),
    ("race", re.compile(r"^(Error|Warning|ERROR|WARNING|INFO): (Race reported|Potential \w+ hazard)")),
    ("synchronisation", re.compile(r"^(Barrier error|Syncwarp error|Divergent|Invalid (arguments|barrier))")),
    ("exit status", re.compile(r"^Target application returned an error")),
]
# Lines that are the tool speaking about itself, not a report.
_BANNERS = re.compile(r"^(COMPUTE-SANITIZER|This tool |Please use |Process ID:|Running |Target application terminated before first instrumented API call)")


def find(explicit=None):
    """Where this host's compute-sanitizer is, looked for beside nvcc: on PATH, in $CUDA_HOME/bin
    (and $CUDA_PATH/bin), in /usr/local/cuda*/bin, and next to the real path of the nvcc on PATH;
    or `explicit`, when given. Returns {"path": ..., "found_by": ..., "version": ...,
    "looked": [...]}; path is None when none was found."""
    looked = []
    if explicit:
        return _with_version({"path": explicit, "found_by": "--sanitizer-path", "looked": []})

    def candidate(path, how):
        looked.append(path)
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return {"path": path, "found_by": how}
        return None

    found = None
    on_path = shutil.which("compute-sanitizer")
    looked.append("PATH")
    if on_path:
        found = {"path": on_path, "found_by": "PATH"}
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        if found is None:
            if os.environ.get(variable):
                found = candidate(os.path.join(os.environ[variable], "bin", "compute-sanitizer"),
                                  "$%s/bin" % variable)
            else:
                looked.append("$%s (unset)" % variable)
    if found is None:
        folders = sorted(glob.glob("/usr/local/cuda*/bin"), reverse=True)
        if not folders:
            looked.append("/usr/local/cuda*/bin (none)")
        for folder in folders:
            found = candidate(os.path.join(folder, "compute-sanitizer"), folder)
            if found:
                break
    if found is None:
        nvcc = shutil.which("nvcc")
        if nvcc:
            folder = os.path.dirname(os.path.realpath(nvcc))
            found = candidate(os.path.join(folder, "compute-sanitizer"),
                              "beside nvcc (%s)" % os.path.realpath(nvcc))
        else:
            looked.append("beside nvcc (no nvcc on PATH)")
    if found is None:
        return {"path": None, "found_by": None, "version": None, "looked": looked}
    found["looked"] = looked
    return _with_version(found)


def _with_version(found):
    try:
        out = subprocess.run([found["path"], "--version"], capture_output=True, text=True,
                             timeout=60, errors="replace")
        lines = [line.strip() for line in (out.stdout + out.stderr).splitlines() if line.strip()]
        found["version"] = lines[-1] if lines else "unknown"
    except (OSError, subprocess.TimeoutExpired) as error:
        found["version"] = "unknown (%s)" % error
    return found


# For a Python program, host backtraces are left out (device backtraces stay): to give the
# Python frames of a host backtrace, compute-sanitizer 2025.3.1 keeps the frame objects it walks
# at each driver call, and every local those frames had when their function returned stays
# alive with them: buffers the program let go of are never freed (measured on an H200 with
# docs/driver-probe/sanitizer_python_frames.py: "freed after del: False" with the default
# backtraces, True with `--show-backtrace device` or `no`; docs/gpu-validation.md). A report on
# a Python program then names no host frames; the test and the report's address still do.
PYTHON_PROGRAM = ["--show-backtrace", "device"]


def is_python(program):
    """Whether `program` (a list) runs a Python interpreter."""
    return os.path.basename(str(program[0])).startswith("python")


def command(sanitizer, tool, log_template, program):
    """The command line that runs `program` (a list) under `tool`, each process's report written
    to `log_template` with %p (the process id) in it."""
    extra = PYTHON_PROGRAM if is_python(program) else []
    return ([sanitizer] + TOOLS[tool] + COMMON + extra + ["--log-file", log_template, "--"]
            + list(program))


def logs_of(log_template):
    """The log files `command(..., log_template, ...)` wrote (one per process)."""
    return sorted(glob.glob(log_template.replace("%p", "*")))


def parse(text):
    """What one tool's log says: {"reports": [{"kind", "first", "lines"}], "errors": N or None,
    "leaked_bytes": N or None, "leaked_allocations": N or None, "hazards": N or None,
    "processes": N (the logs' banners)}."""
    result = {"reports": [], "errors": None, "leaked_bytes": None, "leaked_allocations": None,
              "hazards": None, "processes": 0}
    current = None
    for raw in text.splitlines():
        match = _LINE.match(raw)
        if not match:
            current = None  # the program's own output, if it shares the stream
            continue
        body = match.group(1)
        if not body:
            current = None  # a bare prefix line ends a report
            continue
        if not body.strip():
            continue
        if body[0].isspace():
            if current is not None:
                current["lines"].append(body.strip())
            continue
        current = None
        summary = _summary(body, result)
        if summary:
            continue
        if _BANNERS.match(body):
            if body.startswith("COMPUTE-SANITIZER"):
                result["processes"] += 1
            continue
        kind = next((name for name, pattern in _KINDS if pattern.match(body)), "other")
        current = {"kind": kind, "first": body.strip(), "lines": []}
        result["reports"].append(current)
    return result


def _summary(body, result):
    for name, pattern in _SUMMARIES.items():
        match = pattern.match(body)
        if not match:
            continue
        numbers = [int(g) for g in match.groups()]
        if name == "errors":
            result["errors"] = (result["errors"] or 0) + numbers[0]
        elif name == "leaked":
            result["leaked_bytes"] = (result["leaked_bytes"] or 0) + numbers[0]
            result["leaked_allocations"] = (result["leaked_allocations"] or 0) + numbers[1]
        else:
            result["hazards"] = (result["hazards"] or 0) + numbers[0]
        return True
    return False


def parse_logs(log_template):
    """`parse` of every log `log_template` names, merged, with the files' names."""
    merged = parse("")
    merged["files"] = []
    for path in logs_of(log_template):
        with open(path, errors="replace") as f:
            one = parse(f.read())
        merged["files"].append(path)
        merged["reports"].extend(one["reports"])
        merged["processes"] += one["processes"]
        for key in ("errors", "leaked_bytes", "leaked_allocations", "hazards"):
            if one[key] is not None:
                merged[key] = (merged[key] or 0) + one[key]
    return merged


def counts(parsed):
    """Reports by kind, e.g. {"leak": 2, "stream-ordered race": 1} ("exit status" left out: the
    runner judges a program's exit itself)."""
    out = {}
    for report in parsed["reports"]:
        if report["kind"] != "exit status":
            out[report["kind"]] = out.get(report["kind"], 0) + 1
    return out


# --- Self-test: recorded output of each kind (compute-sanitizer 2025.x layout) ------------------

_SAMPLES = {
    "clean memcheck": (
        "========= COMPUTE-SANITIZER\n"
        "========= LEAK SUMMARY: 0 bytes leaked in 0 allocations\n"
        "========= ERROR SUMMARY: 0 errors\n",
        {}, 0, 0),
    "a leak": (
        "========= COMPUTE-SANITIZER\n"
        "========= Leaked 1,024 bytes at 0x7879c0800000\n"
        "=========     Saved host backtrace up to driver entry point at allocation time\n"
        "=========         Host Frame: cuMemAlloc_v2 [0x26ec97] in libcuda.so.1\n"
        "=========         Host Frame: main [0xae5c] in memcheck_demo\n"
        "=========\n"
        "========= LEAK SUMMARY: 1024 bytes leaked in 1 allocations\n"
        "========= ERROR SUMMARY: 1 error\n",
        {"leak": 1}, 1, 1024),
    "a stream-ordered race": (
        "========= COMPUTE-SANITIZER\n"
        "========= Free-before-alloc on allocation of size 256 bytes at 0x3366000000\n"
        "=========     Address 0x3366000000 is potentially free'd before it is allocated\n"
        "=========     \n"
        "=========     Saved host backtrace up to driver entry point at cudaFreeAsync time\n"
        "=========         Host Frame: cuMemFreeAsync [0x3a2a5f] in libcuda.so.1\n"
        "=========\n"
        "========= ERROR SUMMARY: 1 error\n",
        {"stream-ordered race": 1}, 1, None),
    "an access and an API error": (
        "========= COMPUTE-SANITIZER\n"
        "test result: ok. 1 passed\n"
        "========= Invalid __global__ write of size 4 bytes\n"
        "=========     at unaligned_kernel():0x160 in memcheck_demo.cu:6\n"
        "=========     by thread (0,0,0) in block (0,0,0)\n"
        "=========     Address 0x7f6510c00001 is misaligned\n"
        "=========\n"
        "========= Program hit CUDA_ERROR_INVALID_VALUE (error 1) due to \"invalid argument\" on CUDA API call to cuMemFreeAsync.\n"
        "=========     Saved host backtrace up to driver entry point at error\n"
        "=========\n"
        "========= Target application returned an error\n"
        "========= ERROR SUMMARY: 2 errors\n",
        {"memory access": 1, "api error": 1}, 2, None),
    "racecheck": (
        "  ========= COMPUTE-SANITIZER\n"
        "  ========= Error: Race reported between Write access at kernel()+0xa70 in k.cu:980\n"
        "  =========     and Read access at kernel()+0xb20 in k.cu:985 [4 hazards]\n"
        "  =========\n"
        "  ========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)\n",
        {"race": 1}, None, None),
}


def self_test():
    """Checks `parse` and `counts` on the recorded samples; returns the failures (none: [])."""
    failures = []
    for name, (text, kinds, errors, leaked) in _SAMPLES.items():
        parsed = parse(text)
        got = (counts(parsed), parsed["errors"], parsed["leaked_bytes"], parsed["processes"])
        want = (kinds, errors, leaked, 1)
        if got != want:
            failures.append("%s: got %r, want %r" % (name, got, want))
    race = parse(_SAMPLES["racecheck"][0])
    if race["hazards"] != 1 or race["reports"][0]["lines"] != [
            "and Read access at kernel()+0xb20 in k.cu:985 [4 hazards]"]:
        failures.append("racecheck: %r" % race)
    race_free = parse(_SAMPLES["a stream-ordered race"][0])["reports"][0]
    if race_free["first"] != "Free-before-alloc on allocation of size 256 bytes at 0x3366000000" \
            or len(race_free["lines"]) != 3:
        failures.append("stream-ordered race lines: %r" % race_free)
    python = command("cs", "memcheck", "l%p", ["/venv/bin/python3", "-m", "pytest"])
    native = command("cs", "memcheck", "l%p", ["/bundle/bin/first_program"])
    if python[python.index("--") - 4:python.index("--") - 2] != PYTHON_PROGRAM \
            or "--show-backtrace" in native:
        failures.append("host backtraces: left out for Python only: %r, %r" % (python, native))
    return failures


def report_self_test(name, problems, passed):
    """Prints a self-test's problems and then its verdict (`passed` when there are none), each line
    headed "<name> self-test: " (this file's and run.py's --self-test); returns the exit status,
    1 on a problem."""
    for problem in problems:
        print("%s self-test: %s" % (name, problem))
    print("%s self-test: %s" % (name, "FAILED" if problems else passed))
    return 1 if problems else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(report_self_test("sanitizer", self_test(), "%d samples passed" % len(_SAMPLES)))
    print(find())
