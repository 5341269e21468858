#!/usr/bin/env python3
"""custody GPU runner: runs the bundled tests against a real CUDA driver and the emulator.

Built by `cargo xtask gpu-bundle` into gpu-bundle/ (this file, manifest.json, bin/, the emulated
driver libcuda_emu.so, examples/ and, once pybind exists, python/). Needs only Python 3.9+ and
its standard library (the Python package's steps: Python 3.11+, with pytest), so it runs on a GPU
host with no Rust toolchain and no network.

What it does:
  1. prints the host, the GPU (nvidia-smi) and the driver it is about to test;
  2. lists the tests of each bundled binary and runs EACH test in its own process against the
     real driver (`<bin> --exact <name> --test-threads=1`, with a timeout), except binaries
     marked emulator-only, which run against the bundled emulator instead; a test still running
     at its timeout is examined before it is killed: every thread's state, CPU use, wait channel
     and system call from /proc, and its user-space backtrace, which the test binary prints when
     sent SIGUSR2 (test-support's `stacks`), all in the test's log (docs/testing.md, "When a test
     hangs"); --repeat N runs each selected test N times side by side (with --jobs);
  3. runs the conformance binary a second time against the bundled emulator, so that one run
     compares both drivers case by case;
  4. runs the bundled pytest suite against the real driver, if the bundle has one (bounded by
     --pytest-timeout and examined like a hung test past it; the tests marked `own_process`
     each in a pytest process of its own afterwards, under --timeout, with the hang
     diagnostics, which for a Python process are every thread's Python stack), and the
     install check: pip installs the bundled wheel into a fresh virtual environment (so pip
     checks its tags against this host's glibc and Python) and runs
     python/smoke/installed_wheel.py there against the real driver;
  5. runs the demo: the Rust hand-off example, the facade's new-user program (first_program)
     and its cudarc example (cudarc_interop) against the real driver and the emulator, the
     Python one (examples/handoff.py, with the bundled wheel) likewise, and the differential
     script (examples/differential.py: custody and cuda.core side by side) against the real
     driver; their output goes to --out/demo/ (differential.txt and differential.json there);
  6. writes summary.json, summary.md (a table: test, real driver, emulator) and the output of
     every test that did not pass (or that passed with an `observed:` line) to --out (default
     ./results), as the run goes: each log when its test ends, the summary after every test and
     step, the pytest suite's log as it runs, so that a run stopped from outside (a time limit
     on the GPU host's calls) keeps everything that had ended;
  7. with --foreign-tests DIR (after the tests, or alone with --foreign-only): runs that pytest
     tree (NVIDIA's cuda.core test suite, carried beside the bundle) with --foreign-python
     (default: this interpreter, which must have cuda.core, cuda-bindings and pytest) on the
     real driver and on the bundled emulator, per test both outcomes and whether they agree
     (foreign/foreign_tests.py, the harness of `cargo xtask foreign-tests`); results in
     --out/foreign/ (results.md, results.json, JUnit XML of both runs);
  8. with --bench (after all that) or --bench-only (instead of it): runs the benchmarks against
     the real driver (bench_run.py: custody against raw driver calls in Rust, and against
     cuda.core, CuPy, PyTorch and cuda-bindings in Python; at most 4 minutes) and writes
     --out/bench/*.json, for `cargo xtask bench --from-results DIR` on the build machine.

With --sanitizer, instead of all that: the real-driver Rust tests (each in its own process), the
pytest suite (each test in its own process) and the demo under NVIDIA's compute-sanitizer, found
beside nvcc (sanitizer.py: PATH, $CUDA_HOME/bin, /usr/local/cuda*/bin, next to nvcc's real path;
--sanitizer-path to choose), memcheck for all of them and racecheck and synccheck for the
programs that launch kernels; each process's report under --out/sanitizer/, a row per program
and tool in summary.md (docs/testing.md, "Under compute-sanitizer"). --tests-only runs the Rust
tests alone, --python-only the pytest suite and the demo alone, --pytest-only the pytest suite.

The parts of the usual run, for a GPU host that bounds each call (docs/testing.md, "Splitting a
bundle run across calls"): --tests-only (the Rust tests), --python-only (the pytest suite, the
install check and the demo), --pytest-only (the pytest suite alone), --bench-only.

Exit status: 0 when everything ran and passed (under --sanitizer: with no report); 1 when a test
failed; 2 when no real driver could be loaded (the emulator column is still filled in, to check
the runner itself), or, under --sanitizer, when no compute-sanitizer was found.

`python3 run.py --self-test` checks what needs no GPU: the sanitizer report parser on recorded
output, a run under a stand-in sanitizer, the Python stacks of a hung Python process and its
child, and --tests-only and --pytest-only on a stand-in bundle, with rows and logs written as each
test ends (cargo xtask test runs it: xtask/tests/bundle_runner.rs).

  python3 gpu-bundle/run.py [--out DIR] [--driver PATH] [--timeout SECONDS] [--jobs N]
                            [--filter TEXT ...] [--repeat N]
                            [--tests-only | --python-only | --pytest-only]
                            [--pytest-timeout SECONDS]
                            [--sanitizer [--sanitizer-path PATH]]
                            [--bench | --bench-only] [--bench-quick]
                            [--foreign-tests DIR [--foreign-only] [--foreign-python PY]
                             [--foreign-preset NAME] [--foreign-paths PATH ...]]

--driver PATH uses the library at PATH as "the real driver" (CUSTODY_CUDA_DRIVER=PATH), for
example the bundled emulator, to exercise this runner on a machine without a GPU (the GPU-only
test then fails, as it should: it checks that the driver is real).
"""

import argparse
import concurrent.futures
import contextlib
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
import threading
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DRIVER_ENV = "CUSTODY_CUDA_DRIVER"
PASS, FAIL, TIMEOUT, CRASH, SKIP, NOT_RUN = "pass", "FAIL", "TIMEOUT", "CRASH", "skip", "-"


def probe_driver(path):
    """Loads a driver library with ctypes and asks it who it is (the differential harness's
    probe: {loaded, path, version, devices (their names), emulated, error}).

    `path` None means the system's libcuda.so.1 (what the tests load without DRIVER_ENV).
    """
    return foreign_harness().probe_driver(path or "libcuda.so.1")


def foreign_harness():
    """The differential harness's module, foreign_tests.py: in foreign/ beside this file in the
    bundle, in ../foreign in the source tree."""
    folder = HERE / "foreign" if (HERE / "foreign").is_dir() else HERE.parent / "foreign"
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    import foreign_tests
    return foreign_tests


def version_text(version):
    if version is None:
        return "unknown version"
    return "CUDA %d.%d (%d)" % (version // 1000, version % 1000 // 10, version)


def nvidia_smi():
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return "nvidia-smi failed: %s" % error
    return out.stdout.strip() or out.stderr.strip()


def list_tests(binary):
    out = subprocess.run([str(binary), "--list", "--format", "terse"],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError("%s --list failed: %s" % (binary.name, out.stderr.strip()))
    return [line[:-len(": test")] for line in out.stdout.splitlines() if line.endswith(": test")]


class Collector:
    """Reads one pipe of a child process on its own thread, so that what the child writes can be
    looked at while it still runs (a hung test's stack dumps) and kept after it is killed."""

    def __init__(self, pipe, tee=None):
        self._pipe = pipe
        self._tee = tee
        self._chunks = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        fd = self._pipe.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            with self._lock:
                self._chunks.append(chunk)
            if self._tee is not None:
                self._tee.write(chunk)
        # Closed here, at the end of the child's output: a run of hundreds of tests must not
        # keep two descriptors per test open.
        with contextlib.suppress(OSError):
            self._pipe.close()

    def text(self):
        with self._lock:
            data = b"".join(self._chunks)
        return data.decode(errors="replace")

    def join(self, timeout):
        self._thread.join(timeout)


class Tee:
    """A file that a process's output is appended to as it arrives (both pipes, one lock), so
    that what a long process wrote is on disk even if this runner is stopped from outside."""

    def __init__(self, path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "wb")
        self._lock = threading.Lock()

    def write(self, data):
        if isinstance(data, str):
            data = data.encode(errors="replace")
        with self._lock:
            with contextlib.suppress(OSError, ValueError):
                self._file.write(data)
                self._file.flush()

    def close(self):
        with self._lock:
            with contextlib.suppress(OSError):
                self._file.close()


def run_process(command, env, timeout, judge, cwd=None, live_log=None):
    """Runs `command` (a list) as one process; returns {status, rc, seconds, output}, the status
    from `judge(returncode, stdout, output)` when it exits. A process still running after
    `timeout` seconds is examined (hang_diagnostics, with every process it started) and then
    killed, with its descendants. With `live_log` (a path), the output is also written there as
    it arrives, the diagnostics after it."""
    started = time.monotonic()
    tee = Tee(live_log) if live_log else None
    try:
        proc = subprocess.Popen([str(part) for part in command], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd)
        return _wait_for(proc, Collector(proc.stdout, tee), Collector(proc.stderr, tee), tee,
                         started, timeout, judge)
    finally:
        if tee is not None:
            tee.close()


def _wait_for(proc, stdout, stderr, tee, started, timeout, judge):
    """run_process's wait for `proc`, whose pipes `stdout` and `stderr` collect."""
    try:
        returncode = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        diagnostics = hang_diagnostics(proc.pid, stderr)
        kill_tree(proc)
        for collector in (stdout, stderr):
            collector.join(5)  # a leftover grandchild may hold the pipe open
        tail = "\n" + diagnostics + "\n[killed after %d s]" % timeout
        if tee is not None:
            tee.write(tail)
        return {"status": TIMEOUT, "rc": None, "seconds": timeout,
                "output": stdout.text() + stderr.text() + tail}
    for collector in (stdout, stderr):
        collector.join(max(1.0, timeout - (time.monotonic() - started)))
    seconds = round(time.monotonic() - started, 3)
    out_text, err_text = stdout.text(), stderr.text()
    output = out_text + err_text
    if returncode < 0:
        tail = "\n[killed by signal %d]" % -returncode
        if tee is not None:
            tee.write(tail)
        return {"status": CRASH, "rc": returncode, "seconds": seconds, "output": output + tail}
    return {"status": judge(returncode, out_text, output), "rc": returncode, "seconds": seconds,
            "output": output}


def judge_rust_test(returncode, stdout, output):
    """A libtest run of one test: passed only if it says so (libtest exits 0 when the filter
    matched nothing), skipped if it printed a line starting with `skipped`."""
    if returncode != 0:
        return FAIL
    if "test result: ok. 1 passed" not in stdout:
        return FAIL
    if any(line.lstrip().startswith("skipped") for line in output.splitlines()):
        return SKIP
    return PASS


def rust_test_command(binary, name):
    # --nocapture so that a test's "skipped ..." line (a stated skip condition, such as a
    # single-device host) reaches this runner and is counted as a skip, not a pass.
    return [binary, "--exact", name, "--test-threads=1", "--nocapture"]


def run_test(binary, name, env, timeout):
    """Runs one test in its own process; returns {status, rc, seconds, output}. A test still
    running after `timeout` seconds is examined (hang_diagnostics) and then killed."""
    return run_process(rust_test_command(binary, name), env, timeout, judge_rust_test)


# --- Hang diagnostics (docs/testing.md, "When a test hangs") -------------------------------------
# The signal a test binary's stack-dump handler answers, and the lines around each dump: the
# test-support crate's `stacks` module (test-support/src/stacks.rs) defines the same.
STACK_DUMP_SIGNAL = signal.SIGUSR2
DUMP_END = "custody-stack-dump end tid"
# How long to wait for one thread's dump, and for all of a process's.
DUMP_WAIT_S, DUMP_TOTAL_S = 5.0, 60.0
# x86_64 and aarch64 numbers of the tgkill system call (a signal to one thread of another process).
SYS_TGKILL = {"x86_64": 234, "aarch64": 131}


def read_proc(path):
    """A /proc file's text, or why it could not be read."""
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace").strip()
    except OSError as error:
        return "(unreadable: %s)" % (error.strerror or error)


def thread_ids(pid):
    try:
        return sorted(int(t) for t in os.listdir("/proc/%d/task" % pid) if t.isdigit())
    except OSError:
        return []


def process_tree(pid):
    """`pid` and its descendants (from /proc/<pid>/task/<tid>/children), parents first."""
    seen, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        if p in seen:
            continue
        seen.append(p)
        for tid in thread_ids(p):
            children = read_proc("/proc/%d/task/%d/children" % (p, tid))
            todo.extend(int(c) for c in children.split() if c.isdigit())
    return seen


def thread_stat(pid, tid):
    """(state letter, user+system clock ticks) from /proc/<pid>/task/<tid>/stat, or None."""
    text = read_proc("/proc/%d/task/%d/stat" % (pid, tid))
    fields = text[text.rfind(")") + 2:].split() if ")" in text else []
    if len(fields) < 13:
        return None
    return fields[0], int(fields[11]) + int(fields[12])


def catches_signal(pid, signum):
    """Whether process `pid` has a handler for `signum` (SigCgt in /proc/<pid>/status)."""
    for line in read_proc("/proc/%d/status" % pid).splitlines():
        if line.startswith("SigCgt:"):
            try:
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
            except (IndexError, ValueError):
                return False
    return False


def tgkill(pid, tid, signum):
    """Sends `signum` to thread `tid` of process `pid`; None on success, else why not."""
    number = SYS_TGKILL.get(platform.machine())
    if number is None:
        return "no tgkill number for %s" % platform.machine()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(number), ctypes.c_long(pid), ctypes.c_long(tid),
                    ctypes.c_long(signum)) != 0:
        return os.strerror(ctypes.get_errno())
    return None


def is_python(pid):
    """Whether process `pid` is a Python interpreter (its executable's name)."""
    try:
        return os.path.basename(os.readlink("/proc/%d/exe" % pid)).startswith("python")
    except OSError:
        return False


PYTHON_DUMP_MARK = "(most recent call first)"


def python_stacks(pid, stderr):
    """Asks Python process `pid` for every thread's Python stack: the test suite's conftest
    registers faulthandler for STACK_DUMP_SIGNAL in each test process and in the children that
    import a test module, writing to the process's stderr, which is the test's (a child shares
    its parent's). One signal answers for all threads. Returns the line for the diagnostics."""
    if not catches_signal(pid, STACK_DUMP_SIGNAL):
        return ("process %d (Python) does not catch signal %d: no Python stacks from it"
                % (pid, STACK_DUMP_SIGNAL))
    before = stderr.text().count(PYTHON_DUMP_MARK)
    try:
        os.kill(pid, STACK_DUMP_SIGNAL)
    except OSError as error:
        return "process %d (Python): signal not sent: %s" % (pid, error)
    wait_until = time.monotonic() + DUMP_WAIT_S
    while stderr.text().count(PYTHON_DUMP_MARK) == before and time.monotonic() < wait_until:
        time.sleep(0.05)
    time.sleep(0.2)  # the rest of the dump (one write per line)
    if stderr.text().count(PYTHON_DUMP_MARK) == before:
        return ("process %d (Python): no stacks within %.0f s (its stderr may not be this "
                "test's: pytest capturing?)" % (pid, DUMP_WAIT_S))
    return "process %d (Python): every thread's Python stack dumped (stderr, above)" % pid


def hang_diagnostics(pid, stderr):
    """What a hung test process and its descendants are doing, before they are killed: for every
    thread its name, state, CPU time used over one second, kernel wait channel, current system
    call and (where readable) kernel stack; then each thread's user-space backtrace, asked for
    with STACK_DUMP_SIGNAL where the process catches it (running threads first; the dumps land
    in the test's stderr, `stderr` here), or for a Python process every thread's Python stack
    (one signal, python_stacks); then gdb's or eu-stack's view if the host has one."""
    lines = ["[hang diagnostics: process %d, %s]" % (pid, datetime.datetime.now().isoformat(timespec="seconds"))]
    tree = process_tree(pid)
    before = {(p, t): thread_stat(p, t) for p in tree for t in thread_ids(p)}
    time.sleep(1.0)
    running = []
    for p in tree:
        lines.append("process %d: %s" % (p, read_proc("/proc/%d/cmdline" % p).replace("\0", " ")))
        for t in thread_ids(p):
            base = "/proc/%d/task/%d/" % (p, t)
            now, then = thread_stat(p, t), before.get((p, t))
            state = now[0] if now else "?"
            cpu = "%d ticks in 1 s" % (now[1] - then[1]) if now and then else "cpu unknown"
            if state == "R":
                running.append((p, t))
            lines.append("  tid %d (%s): state %s, %s, wchan %s, syscall %s"
                         % (t, read_proc(base + "comm"), state, cpu, read_proc(base + "wchan") or "0",
                            read_proc(base + "syscall")))
            kernel_stack = read_proc(base + "stack")
            if not kernel_stack.startswith("(unreadable"):
                lines.extend("      " + frame for frame in kernel_stack.splitlines())
            lines.append("      stat: %s" % read_proc(base + "stat"))
    deadline = time.monotonic() + DUMP_TOTAL_S
    for p in tree:
        if is_python(p):
            lines.append(python_stacks(p, stderr))
            continue
        if not catches_signal(p, STACK_DUMP_SIGNAL):
            lines.append("process %d does not catch signal %d: no user-space stacks from it "
                         "(a test binary installs the handler in test-support's start())"
                         % (p, STACK_DUMP_SIGNAL))
            continue
        order = [t for q, t in running if q == p] + [t for t in thread_ids(p) if (p, t) not in running]
        for t in order:
            if time.monotonic() > deadline:
                lines.append("tid %d: not asked (the %d s for all dumps are up)" % (t, DUMP_TOTAL_S))
                continue
            error = tgkill(p, t, STACK_DUMP_SIGNAL)
            if error:
                lines.append("tid %d: signal not sent: %s" % (t, error))
                continue
            marker = "%s %d\n" % (DUMP_END, t)
            wait_until = min(deadline, time.monotonic() + DUMP_WAIT_S)
            while marker not in stderr.text() and time.monotonic() < wait_until:
                time.sleep(0.05)
            lines.append("tid %d: user-space stack %s" % (
                t, "dumped (stderr, above)" if marker in stderr.text()
                else "not dumped within %.0f s (the thread may hold a lock the dump needs)" % DUMP_WAIT_S))
    for tool, command in (("eu-stack", ["eu-stack", "-p", str(pid)]),
                          ("gdb", ["gdb", "-batch", "-p", str(pid), "-ex", "thread apply all bt"])):
        if shutil.which(tool):
            try:
                out = subprocess.run(command, capture_output=True, text=True, errors="replace",
                                     timeout=60)
                lines.append("%s:\n%s%s" % (tool, out.stdout, out.stderr))
            except (OSError, subprocess.TimeoutExpired) as error:
                lines.append("%s failed: %s" % (tool, error))
            break
    else:
        lines.append("(no eu-stack or gdb on this host)")
    lines.append("[end of hang diagnostics]")
    return "\n".join(lines)


def kill_tree(proc):
    """Kills a test process and every descendant it left (an IPC test's child), and reaps it."""
    for p in reversed(process_tree(proc.pid)):
        if p != proc.pid:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
    proc.kill()
    proc.wait()


def driver_env(library):
    """The environment for a test run: DRIVER_ENV=library, or unset for the system driver."""
    env = dict(os.environ)
    env.pop(DRIVER_ENV, None)
    if library:
        env[DRIVER_ENV] = str(library)
    env.setdefault("RUST_BACKTRACE", "1")
    return env


@contextlib.contextmanager
def unpacked_wheels(manifest):
    """The bundled wheels unpacked into a temporary folder (None when the bundle has none)."""
    python = manifest.get("python")
    if not python:
        yield None
        return
    site = Path(tempfile.mkdtemp(prefix="custody-site-"))
    try:
        for wheel in python.get("wheels", []):
            with zipfile.ZipFile(HERE / wheel) as archive:
                archive.extractall(site)
        yield site
    finally:
        shutil.rmtree(site, ignore_errors=True)


def with_site(env, site):
    """`env` with `site` first on PYTHONPATH."""
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return env


# Tests the suite marks `own_process` (pybind/tests/conftest.py): each runs in a pytest process of
# its own, under the per-test limit and with the hang diagnostics, after the rest of the suite.
OWN_PROCESS_MARK = "own_process"


def pytest_base():
    """The interpreter and pytest options every pytest run here uses."""
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]


def judge_pytest(returncode, stdout, output):
    """One pytest run: passed (or skipped, when all it ran skipped) on exit status 0."""
    if returncode != 0:
        return FAIL
    last = (stdout.strip().splitlines() or [""])[-1]
    if "passed" not in last and "skipped" in last:
        return SKIP
    return PASS


def pytest_tests_dir(manifest):
    return HERE / manifest["python"]["tests"]


def collected_tests(manifest, env, marker_expression=None):
    """The node ids (relative to the tests folder) of the suite's tests, or of those that match
    `marker_expression` (the `own_process` ones, say)."""
    selection = ["-m", marker_expression] if marker_expression else []
    out = subprocess.run(pytest_base() + ["--collect-only", "-q"] + selection,
                         capture_output=True, text=True, env=env, errors="replace",
                         cwd=str(pytest_tests_dir(manifest)), timeout=600)
    return [line.strip() for line in out.stdout.splitlines()
            if "::" in line and not line.startswith(" ")]


def pytest_env(manifest, env, site):
    """`env` for the bundled pytest suite: the unpacked wheel first on PYTHONPATH and, when the
    bundle has it, custody's PyTorch allocator library for test_interop*.py."""
    env = with_site(env, site)
    library = manifest["python"].get("torch_allocator")
    if library:
        env["CUSTODY_TORCH_ALLOCATOR"] = str(HERE / library)
    return env


def run_pytest(manifest, env, out_dir, timeout, on_row=None):
    """Runs the bundled pytest suite with the bundled wheel on PYTHONPATH: first everything but
    the `own_process` tests in one pytest process (bounded by `timeout`, examined like a hung
    test if it runs past it; `-v`, its output written to logs/pytest.real.log as it comes, so
    that a run stopped from outside still names every test that ended), then each
    `own_process` test in a process of its own (`-s`, so that its stacks reach its log if it
    hangs), bounded by `timeout[1]` (`timeout[0]` bounds the rest), each row given to `on_row`
    as it ends. Returns (result, rows): the suite's result and one table row per
    `own_process` test."""
    with unpacked_wheels(manifest) as site:
        env = pytest_env(manifest, env, site)
        log = out_dir / "logs" / "pytest.real.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        junit = out_dir / "logs" / "pytest.real.xml"  # every test's outcome, by name
        command = pytest_base() + ["-v", "-rs", "--junitxml", junit, "-m",
                                   "not " + OWN_PROCESS_MARK, pytest_tests_dir(manifest)]
        ran = run_process(command, env, timeout[0], judge_pytest, live_log=log)
        log.write_text(ran["output"])
        last = ([line for line in ran["output"].splitlines() if line.strip()
                 and not line.startswith("[")] or [""])[-1]
        if ran["status"] == PASS:
            result = {"status": PASS, "detail": last}
        elif ran["status"] == TIMEOUT:
            result = {"status": TIMEOUT, "detail": "still running after %d s (see %s)" % (timeout[0], log)}
        elif ran["rc"] == 5:
            result = {"status": FAIL, "detail": "pytest collected no tests"}
        else:
            result = {"status": FAIL, "detail": "%s (see %s)" % (last, log)}
        rows = []
        for nodeid in collected_tests(manifest, env, OWN_PROCESS_MARK):
            row = {"binary": "pytest", "test": nodeid, "role": "pytest",
                   "real": run_process(pytest_base() + ["-q", "-rs", "-s", nodeid], env,
                                       timeout[1], judge_pytest, cwd=str(pytest_tests_dir(manifest))),
                   "emulator": {"status": NOT_RUN}}
            print("  %-8s %-8s pytest :: %s (own process)" % (row["real"]["status"], NOT_RUN, nodeid),
                  flush=True)
            rows.append(row)
            if on_row is not None:
                on_row(row)
        if rows:
            result["detail"] += "; %d own-process test(s) in the table" % len(rows)
        return result, rows


def run_install_check(manifest, env, out_dir):
    """pip installs the bundled wheel into a fresh virtual environment and runs the install check
    there (isolated: `python -I`, from inside the environment) with `env`'s driver."""
    python = manifest["python"]
    check = python.get("install_check")
    if not check:
        return {"status": SKIP, "detail": "the bundle has no install check"}
    log = out_dir / "logs" / "install.real.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    venv = Path(tempfile.mkdtemp(prefix="custody-venv-"))
    transcript = []

    def step(command, **kwargs):
        out = subprocess.run([str(c) for c in command], capture_output=True, text=True,
                             errors="replace", **kwargs)
        transcript.append("$ %s\n%s%s" % (" ".join(str(c) for c in command), out.stdout, out.stderr))
        return out

    try:
        vpy = venv / "bin" / "python"
        pip = [vpy, "-m", "pip"]
        if step([sys.executable, "-m", "venv", venv]).returncode != 0:
            # No ensurepip here (Debian/Ubuntu without python3-venv): an environment without
            # pip, filled by this interpreter's own pip (22.3+ has --python).
            shutil.rmtree(venv, ignore_errors=True)
            if step([sys.executable, "-m", "venv", "--without-pip", venv]).returncode != 0:
                return {"status": SKIP, "detail": "python3 -m venv does not work on this host"}
            pip = [sys.executable, "-m", "pip", "--python", vpy]
        wheels = [HERE / wheel for wheel in python.get("wheels", [])]
        installed = step(pip + ["install", "--no-index", "--no-deps", "--disable-pip-version-check"]
                         + wheels)
        if installed.returncode != 0:
            last = (installed.stderr.strip().splitlines() or [""])[-1]
            return {"status": FAIL, "detail": "pip did not install %s: %s (see %s)"
                    % (", ".join(w.name for w in wheels), last, log)}
        env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
        ran = step([vpy, "-I", HERE / check], cwd=str(venv), env=env)
        last = (ran.stdout.strip().splitlines() or [""])[-1]
        if ran.returncode == 0:
            return {"status": PASS, "detail": "%s (%s)" % (last, ", ".join(w.name for w in wheels))}
        return {"status": FAIL, "detail": "%s (see %s)" % (last, log)}
    finally:
        log.write_text("\n".join(transcript))
        shutil.rmtree(venv, ignore_errors=True)


def run_program(command, env, timeout, log):
    """Runs one demo program, writing its whole output to `log`; returns {status, rc, detail,
    log}. Exit status 0 passes, unless the program printed a line `<name>: skipped: <why>`
    (cudarc_interop does when custody's driver is not the system's): that is a skip, with the
    reason as its detail, so a real-driver run that did not really run reads as one; anything
    else fails."""
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        out = subprocess.run([str(part) for part in command], capture_output=True, text=True,
                             env=env, timeout=timeout, errors="replace", cwd=str(HERE))
    except subprocess.TimeoutExpired as expired:
        output = expired.stdout or ""
        if isinstance(output, bytes):
            output = output.decode(errors="replace")
        log.write_text(output + "\n[killed after %d s]\n" % timeout)
        return {"status": TIMEOUT, "rc": None, "detail": "killed after %d s" % timeout, "log": str(log)}
    log.write_text(out.stdout + ("\n--- stderr ---\n" + out.stderr if out.stderr.strip() else ""))
    lines = out.stdout.strip().splitlines()
    last = (lines or [""])[-1]
    skipped = [line for line in lines if ": skipped: " in line and not line.startswith(" ")]
    if out.returncode == 0 and skipped:
        status, last = SKIP, skipped[0]
    elif out.returncode == 0:
        status = PASS
    elif out.returncode < 0:
        status = CRASH
    else:
        status = FAIL
    return {"status": status, "rc": out.returncode, "detail": last[:300], "log": str(log)}


def run_demo(manifest, real_ok, driver_path, emulator_path, emulator_ok, out_dir, timeout):
    """The demo rows: the Rust and Python hand-off examples on the real driver and on the
    emulator, and the differential script (custody vs cuda.core) on the real driver."""
    demo = manifest.get("demo")
    if not demo:
        return [{"name": "demo", "real": {"status": SKIP, "detail": "the bundle has no demo"},
                 "emulator": {"status": NOT_RUN}}]
    logs = out_dir / "demo"
    if logs.exists():
        shutil.rmtree(logs)
    drivers = [("real", driver_path, real_ok, "no real driver"),
               ("emulator", emulator_path, emulator_ok, "the emulator does not load")]

    def both(name, command, env_of):
        row = {"name": name}
        for column, library, usable, why in drivers:
            if not usable:
                row[column] = {"status": NOT_RUN, "detail": why}
                continue
            slug = name.split(" ")[0] + "-" + ("python" if "Python" in name else "rust")
            row[column] = run_program(command, env_of(driver_env(library)), timeout,
                                      logs / ("%s.%s.txt" % (slug, column)))
        return row

    rows = []
    rust = demo.get("rust", {}).get("handoff")
    if rust:
        rows.append(both("handoff (Rust)", [HERE / rust], lambda env: env))
    # The facade's new-user program (custody/examples/first_program.rs): checks what it shows.
    first = demo.get("rust", {}).get("first_program")
    if first:
        rows.append(both("first_program (Rust)", [HERE / first], lambda env: env))
    # cudarc next to custody (custody/examples/cudarc_interop.rs): a kernel launch on the real
    # driver; on the emulator it says it skipped (launches are not emulated).
    interop = demo.get("rust", {}).get("cudarc_interop")
    if interop:
        rows.append(both("cudarc_interop (Rust)", [HERE / interop], lambda env: env))
    scripts = demo.get("python", {})
    with unpacked_wheels(manifest) as site:
        if site is None:
            why = "the bundle has no Python package (pybind does not exist yet)"
            for name in ("handoff (Python)", "differential (custody vs cuda.core)"):
                rows.append({"name": name, "real": {"status": SKIP, "detail": why},
                             "emulator": {"status": NOT_RUN}})
            return rows
        if "handoff.py" in scripts:
            rows.append(both("handoff (Python)", [sys.executable, HERE / scripts["handoff.py"]],
                             lambda env: with_site(env, site)))
        if "differential.py" in scripts:
            row = {"name": "differential (custody vs cuda.core)", "emulator": {"status": NOT_RUN}}
            if real_ok:
                command = [sys.executable, HERE / scripts["differential.py"], "--timeout", timeout,
                           "--json", logs / "differential.json"]
                row["real"] = run_program(command, with_site(driver_env(driver_path), site),
                                          timeout * 30, logs / "differential.txt")
            else:
                row["real"] = {"status": NOT_RUN, "detail": "no real driver"}
            rows.append(row)
    return rows


def run_foreign(args, manifest, out_dir, driver_path, emulator_path, real_ok):
    """The differential harness on --foreign-tests: real driver (or --driver) and the bundled
    emulator. Returns 0 when it ran, 2 without a real driver (the emulator column is still
    filled in)."""
    foreign = manifest.get("foreign")
    if not foreign:
        print("foreign tests: this bundle has no harness (rebuild it with cargo xtask gpu-bundle)")
        return 1
    foreign_tests = foreign_harness()
    tests = Path(args.foreign_tests).resolve()
    preset = args.foreign_preset
    if preset is None and not args.foreign_paths and (tests / "test_stream.py").is_file():
        preset = "cuda-core-all"
    argv = ["--tests", str(tests), "--emulator", str(emulator_path), "--out", str(out_dir / "foreign"),
            "--python", args.foreign_python or sys.executable, "--timeout", str(args.foreign_timeout)]
    if driver_path:
        argv += ["--real-driver", str(driver_path)]
    if preset:
        argv += ["--preset", preset]
    print("\nforeign tests: %s (preset %s)" % (tests, preset or "none"), flush=True)
    foreign_tests.main(argv + list(args.foreign_paths))
    return 0 if real_ok else 2


# --- Under compute-sanitizer (docs/testing.md, "Under compute-sanitizer") -------------------------
# The programs that launch a kernel, where racecheck and synccheck have something to check.
KERNEL_DEMOS = ("cudarc_interop (Rust)",)
KERNEL_PYTEST = ("test_graphs.py::test_a_cupy_kernel_captured_on_a_custody_stream_reads_a_retained_buffer",
                 "test_interop_cupy.py::", "test_interop_torch.py::", "test_interop_numba.py::")
# Set in every program run under the sanitizer: the caching resource passes every allocation and
# free through to the driver, so that leak checks see its blocks (memory/src/resources/caching.rs).
# CUSTODY_UNDER_COMPUTE_SANITIZER tells a test that the sanitizer is between it and the driver
# (conformance's F24 cases: the sanitizer changes what an exiting thread's per-thread work
# orders, so they observe and report what they can there).
SANITIZER_ENV = {"CUSTODY_CACHING_PASS_THROUGH": "1", "CUSTODY_UNDER_COMPUTE_SANITIZER": "1"}


def sanitizer_module():
    sys.path.insert(0, str(HERE))
    import sanitizer
    return sanitizer


def slug(text):
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text)[:180]


def run_sanitized(san, sanitizer_path, tool, program, env, timeout, judge, log_dir, name, cwd=None):
    """Runs `program` under `tool`, each process's report in log_dir/<name>.<tool>.<pid>.log;
    returns run_process's result with "sanitizer": parse_logs' merged reports and "tool"."""
    log_dir.mkdir(parents=True, exist_ok=True)
    template = str(log_dir / ("%s.%s.%%p.log" % (slug(name), tool)))
    for old in san.logs_of(template):
        os.remove(old)
    result = run_process(san.command(sanitizer_path, tool, template, program), env, timeout,
                         judge, cwd=cwd)
    parsed = san.parse_logs(template)
    result["tool"] = tool
    result["sanitizer"] = {"counts": san.counts(parsed), "errors": parsed["errors"],
                           "leaked_bytes": parsed["leaked_bytes"],
                           "first": [r["first"] for r in parsed["reports"] if r["kind"] != "exit status"][:3],
                           "logs": [str(Path(f).relative_to(log_dir.parent.parent)) for f in parsed["files"]],
                           "processes": parsed["processes"]}
    return result


def run_sanitizer_mode(args, manifest, out_dir, driver_path, real_ok):
    """--sanitizer: the real-driver Rust tests (each in its own process, as usual), the pytest
    suite (each test in its own process) and the demo, under compute-sanitizer's memcheck, and
    the programs that launch kernels under racecheck and synccheck too; writes summary.md and
    summary.json with a row per program and tool. Exit status 0 when every program passed with
    no report, 1 otherwise, 2 without a real driver or a compute-sanitizer."""
    san = sanitizer_module()
    found = san.find(args.sanitizer_path)
    print("  sanitizer: %s" % (("%s (found by %s; %s)" % (found["path"], found["found_by"], found["version"]))
                               if found["path"] else "NOT FOUND (looked: %s)" % ", ".join(found["looked"])))
    rows = []
    if found["path"] and real_ok:
        with unpacked_wheels(manifest) as site:
            rows = sanitizer_rows(args, manifest, out_dir, driver_path, san, found, site)
    return sanitizer_summary(args, manifest, out_dir, san, found, real_ok, rows)


def sanitizer_rows(args, manifest, out_dir, driver_path, san, found, site):
    """The runs of --sanitizer, one row per program and tool."""
    env = driver_env(driver_path)
    env.update(SANITIZER_ENV)
    log_dir = out_dir / "sanitizer"
    jobs = []
    if not args.python_only:
        for entry in manifest["binaries"]:
            if entry["role"] == "emulator-only":
                continue
            binary = HERE / entry["file"]
            filters = args.filter or [""]
            for name in list_tests(binary):
                if any(f in name for f in filters):
                    jobs.append(("rust", binary.name, name, "memcheck",
                                 rust_test_command(binary, name), judge_rust_test, None, None))
    if not args.tests_only and site is not None:
        py_env = pytest_env(manifest, env, site)
        tests_dir = str(pytest_tests_dir(manifest))
        for nodeid in collected_tests(manifest, py_env):
            if args.filter and not any(f in nodeid for f in args.filter):
                continue
            launches = any(nodeid.startswith(prefix) for prefix in KERNEL_PYTEST)
            tools = ["memcheck"] + (["racecheck", "synccheck"] if launches else [])
            for tool in tools:
                jobs.append(("pytest", "pytest", nodeid, tool, pytest_base() + ["-q", "-rs", "-s", nodeid],
                             judge_pytest, tests_dir, py_env))
        demo = {} if args.pytest_only else (manifest.get("demo") or {})
        programs = [("%s (Rust)" % key, [HERE / demo["rust"][key]], env)
                    for key in ("handoff", "first_program", "cudarc_interop")
                    if demo.get("rust", {}).get(key)]
        if "handoff.py" in demo.get("python", {}):
            programs.append(("handoff (Python)", [sys.executable, HERE / demo["python"]["handoff.py"]], py_env))
        for name, program, program_env in programs:
            if args.filter and not any(f in name for f in args.filter):
                continue
            tools = ["memcheck"] + (["racecheck", "synccheck"] if name in KERNEL_DEMOS else [])
            for tool in tools:
                jobs.append(("demo", "demo", name, tool, program, judge_program, str(HERE), program_env))

    def run_job(job):
        kind, group, name, tool, program, judge, cwd, job_env = job
        result = run_sanitized(san, found["path"], tool, program, job_env or env, args.timeout,
                               judge, log_dir / group, name, cwd=cwd)
        row = {"binary": group, "test": name, "kind": kind, "tool": tool, "real": result}
        counted = sum(result["sanitizer"]["counts"].values())
        print("  %-8s %-9s %3d report(s)  %s :: %s" % (result["status"], tool, counted, group, name), flush=True)
        return row

    rows = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for done in concurrent.futures.as_completed([pool.submit(run_job, job) for job in jobs]):
            row = done.result()
            result = row["real"]
            if result["status"] not in (PASS, SKIP) or sum(result["sanitizer"]["counts"].values()):
                log = out_dir / "logs" / row["binary"] / ("%s.%s.log" % (slug(row["test"]), row["tool"]))
                log.parent.mkdir(parents=True, exist_ok=True)
                log.write_text(result.get("output", ""))
                result["log"] = str(log.relative_to(out_dir))
            rows.append(row)
            # The summary so far, rewritten after every run: a run stopped from outside (a time
            # limit on the GPU host) still leaves what it had.
            sanitizer_summary(args, manifest, out_dir, san, found, True, rows, quiet=True)
    order = {(job[1], job[2], job[3]): n for n, job in enumerate(jobs)}
    rows.sort(key=lambda row: order[(row["binary"], row["test"], row["tool"])])
    return rows


def sanitizer_summary(args, manifest, out_dir, san, found, real_ok, rows, quiet=False):
    """summary.json and summary.md of --sanitizer; returns the exit status."""
    kinds = sorted({k for row in rows for k in row["real"]["sanitizer"]["counts"]})
    with_reports = [row for row in rows if sum(row["real"]["sanitizer"]["counts"].values())]
    failed = [row for row in rows if row["real"]["status"] not in (PASS, SKIP)]
    summary = {
        "when": datetime.datetime.now().isoformat(timespec="seconds"),
        "mode": "sanitizer",
        "sanitizer": found,
        "bundle_commit": manifest.get("commit"),
        "options": {tool: san.TOOLS[tool] + san.COMMON for tool in san.TOOLS},
        "environment": SANITIZER_ENV,
        "rows": [{k: ({kk: vv for kk, vv in v.items() if kk != "output"} if isinstance(v, dict) else v)
                  for k, v in row.items()} for row in rows],
        "programs": len(rows), "with_reports": len(with_reports), "failed": len(failed),
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = ["# custody under compute-sanitizer", "",
             "- sanitizer: %s" % (("`%s` (found by %s), %s" % (found["path"], found["found_by"], found["version"]))
                                  if found["path"] else "not found (looked: %s)" % ", ".join(found["looked"])),
             "- real driver: %s" % ("loaded" if real_ok else "NOT LOADED"),
             "- bundle commit: %s" % manifest.get("commit"),
             "- memcheck: `%s`" % " ".join(san.MEMCHECK + san.COMMON),
             "- Python programs also `%s` (host backtraces kept Python frames alive: "
             "sanitizer.py)" % " ".join(san.PYTHON_PROGRAM),
             "- racecheck, synccheck: on the programs that launch kernels (%s)"
             % ", ".join(KERNEL_DEMOS + KERNEL_PYTEST),
             "- environment: %s" % ", ".join("%s=%s" % kv for kv in SANITIZER_ENV.items()),
             "- %d program runs, %d with reports, %d did not pass" % (len(rows), len(with_reports), len(failed)),
             "",
             table_row(["group", "test", "tool", "outcome", "reports"] + kinds + ["first report"]),
             table_row(["---"] * (6 + len(kinds)))]
    for row in rows:
        result = row["real"]
        counts = result["sanitizer"]["counts"]
        first = (result["sanitizer"]["first"] or [""])[0].replace("|", "\\|")[:160]
        lines.append(table_row([row["binary"], row["test"], row["tool"], result["status"],
                                str(sum(counts.values()))]
                               + [str(counts.get(k, 0)) for k in kinds] + [first]))
    lines += ["", "Programs with reports: %d of %d; not passed: %d." % (len(with_reports), len(rows), len(failed))]
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")
    if not quiet:
        print("\nresults in %s (summary.md, summary.json, sanitizer/, logs/)" % out_dir)
        print("sanitizer: %d program runs, %d with reports, %d did not pass"
              % (len(rows), len(with_reports), len(failed)))
    if not found["path"] or not real_ok:
        return 2
    return 1 if with_reports or failed else 0


def table_row(cells):
    return "| " + " | ".join(cells) + " |"


def judge_program(returncode, stdout, output):
    """A demo program: exit status 0 passes, unless it said it skipped (run_program's rule)."""
    lines = stdout.strip().splitlines()
    if returncode == 0 and any(": skipped: " in line and not line.startswith(" ") for line in lines):
        return SKIP
    return PASS if returncode == 0 else FAIL


# What a passing test's log is kept for: a line of its output starting with this (a measurement
# the test reports, such as a driver behaviour that it may observe either way).
OBSERVED = "observed:"


def write_row_logs(out_dir, row):
    """Writes a row's logs, logs/<binary>/<test>[.copyN].<column>.log, for each column that did
    not pass, or that passed with a line starting with OBSERVED; records each path in the row."""
    for column in ("real", "emulator"):
        result = row[column]
        output = result.get("output")
        if not output:
            continue
        observed = any(line.lstrip().startswith(OBSERVED) for line in output.splitlines())
        if result["status"] in (PASS, SKIP, NOT_RUN) and not observed:
            continue
        copy = ".copy%d" % row["copy"] if "copy" in row else ""
        log = out_dir / "logs" / row["binary"] / ("%s%s.%s.log" % (row["test"].replace("::", "."), copy, column))
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(output)
        result["log"] = str(log.relative_to(out_dir))


def write_usual_summary(out_dir, manifest, real, emulator, emulator_path, smi, real_ok, part, rows, state):
    """summary.json and summary.md of the usual run, from the rows that have ended so far and
    the steps in `state` (pytest, install, demo, and whether the run has finished); rewritten
    after every test, so that a run stopped from outside keeps what it had. Returns (totals,
    disagreements)."""
    failed_statuses = (FAIL, TIMEOUT, CRASH)
    rows = sorted(rows, key=lambda row: row.get("_order", -1))

    def count(column, status):
        return sum(1 for row in rows if row[column]["status"] == status)

    totals = {column: {"passed": count(column, PASS),
                       "failed": sum(count(column, s) for s in failed_statuses),
                       "skipped": count(column, SKIP),
                       "not_run": count(column, NOT_RUN)} for column in ("real", "emulator")}
    disagreements = [row for row in rows if row["role"] == "conformance" and
                     row["real"]["status"] == PASS and row["emulator"]["status"] in failed_statuses]
    pytest, install, demo = state["pytest"], state["install"], state["demo"]
    progress = "finished" if state["finished"] else "still running, or stopped before it finished"
    summary = {
        "when": datetime.datetime.now().isoformat(timespec="seconds"),
        "part": part,
        "finished": state["finished"],
        "host": platform.platform(),
        "nvidia_smi": smi,
        "real_driver": real,
        "emulator": emulator,
        "bundle_commit": manifest.get("commit"),
        "totals": totals,
        "pytest": pytest,
        "install": install,
        "demo": demo,
        "tests": [{k: ({kk: vv for kk, vv in v.items() if kk != "output"} if isinstance(v, dict) else v)
                   for k, v in row.items() if k != "_order"} for row in rows],
        "emulator_disagreements": [row["test"] for row in disagreements],
    }
    partial = out_dir / "summary.json.partial"
    partial.write_text(json.dumps(summary, indent=2) + "\n")
    partial.replace(out_dir / "summary.json")

    lines = ["# custody GPU run", "",
             "- run: %s; %s (%s)" % (part, progress, summary["when"]),
             "- GPU: %s" % (smi or "nvidia-smi not found"),
             "- real driver: %s" % ("%s, %s, %s" % (real["path"], version_text(real["version"]), real["devices"])
                                     if real_ok else "NOT LOADED (%s)" % real["error"]),
             "- emulator: %s" % emulator_path.name,
             "- bundle commit: %s" % manifest.get("commit"),
             "- pytest: %s (%s)" % (pytest["status"], pytest.get("detail", "")),
             "- install check: %s (%s)" % (install["status"], install.get("detail", "")),
             "",
             "| demo | real driver | emulator |",
             "|---|---|---|"]
    for row in demo:
        lines.append("| %s | %s | %s |" % (row["name"], row["real"]["status"], row["emulator"]["status"]))
    lines += ["",
              "| binary | test | real driver | emulator |",
              "|---|---|---|---|"]
    for row in rows:
        lines.append("| %s | %s | %s | %s |" % (row["binary"], row["test"] + (" (copy %d)" % row["copy"]
                                                                              if "copy" in row else ""),
                                               row["real"]["status"], row["emulator"]["status"]))
    lines += ["", "real driver: %(passed)d passed, %(failed)d failed, %(skipped)d skipped" % totals["real"],
              "emulator: %(passed)d passed, %(failed)d failed" % totals["emulator"]]
    if disagreements:
        lines += ["", "Emulator disagreements (pass on the real driver, fail on the emulator):"]
        lines += ["- %s" % row["test"] for row in disagreements]
    partial = out_dir / "summary.md.partial"
    partial.write_text("\n".join(lines) + "\n")
    partial.replace(out_dir / "summary.md")
    return totals, disagreements


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results", help="where to write the results (default ./results)")
    parser.add_argument("--driver", help="library to use as the real driver (default: the system libcuda.so.1)")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per test (default 120)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="tests to run at once, each in its own process (default 1)")
    parser.add_argument("--filter", action="append", default=None, metavar="TEXT",
                        help="run only tests whose name contains this text (repeatable: any of them)")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run each selected test N times, each in its own process (side by side "
                             "with --jobs); the rows say which copy (default 1)")
    parser.add_argument("--sanitizer", action="store_true",
                        help="instead of the usual run: the real-driver Rust tests, the pytest suite "
                             "(each test in its own process) and the demo under compute-sanitizer "
                             "(memcheck; racecheck and synccheck where kernels run), a table of "
                             "reports in summary.md")
    parser.add_argument("--sanitizer-path", help="the compute-sanitizer to use (default: found "
                                                 "beside nvcc, see sanitizer.py)")
    parser.add_argument("--python-only", action="store_true",
                        help="everything but the Rust tests: the pytest suite, the install check "
                             "and the demo (with --sanitizer: the pytest suite and the demo); with "
                             "--tests-only in another call, the whole run in two")
    parser.add_argument("--pytest-only", action="store_true",
                        help="the pytest suite alone (its own-process tests included): no Rust "
                             "tests, install check or demo; with --sanitizer too")
    parser.add_argument("--pytest-timeout", type=int, default=1800,
                        help="seconds for the pytest suite's main process (default 1800); each "
                             "own-process test has --timeout")
    parser.add_argument("--tests-only", action="store_true",
                        help="run the selected Rust tests only: no pytest, install check or demo")
    parser.add_argument("--bench", action="store_true",
                        help="after the tests, run the benchmarks and write --out/bench/*.json (at most 4 minutes)")
    parser.add_argument("--bench-only", action="store_true", help="run only the benchmarks")
    parser.add_argument("--bench-quick", action="store_true", help="short benchmark runs (to check the runner)")
    parser.add_argument("--foreign-tests", metavar="DIR",
                        help="a pytest tree (cuda.core's tests folder) to run on both drivers and compare")
    parser.add_argument("--foreign-only", action="store_true", help="run only the --foreign-tests comparison")
    parser.add_argument("--foreign-python", help="the interpreter for --foreign-tests (default: this one)")
    parser.add_argument("--foreign-preset", default=None,
                        help="a path list of the harness (default: cuda-core-all when DIR has test_stream.py)")
    parser.add_argument("--foreign-paths", nargs="*", default=[], help="files or folders under DIR to run")
    parser.add_argument("--foreign-timeout", type=int, default=900, help="seconds per file and driver")
    args = parser.parse_args(argv)
    if args.foreign_only and not args.foreign_tests:
        parser.error("--foreign-only needs --foreign-tests DIR")
    if sum((args.tests_only, args.python_only, args.pytest_only)) > 1:
        parser.error("--tests-only, --python-only and --pytest-only each choose a part: give one")
    if args.pytest_only:
        args.python_only = True  # the Rust tests are left out; so are the install check and demo
    if args.bench or args.bench_only:
        sys.path.insert(0, str(HERE))
        import bench_run

    manifest = json.loads((HERE / "manifest.json").read_text())
    out_dir = Path(args.out).resolve()
    if (out_dir / "logs").exists():
        shutil.rmtree(out_dir / "logs")
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)

    driver_path = Path(args.driver).resolve() if args.driver else None
    emulator_path = HERE / manifest["emulator"]
    real = probe_driver(driver_path)
    emulator = probe_driver(emulator_path)
    smi = nvidia_smi()

    print("custody GPU run, %s" % datetime.datetime.now().isoformat(timespec="seconds"))
    print("  host:      %s, Python %s" % (platform.platform(), platform.python_version()))
    print("  bundle:    commit %s, built on %s" % (manifest.get("commit"), manifest.get("built_on")))
    print("  GPU:       %s" % (smi if smi else "nvidia-smi not found"))
    if real["loaded"] and not real["error"]:
        print("  driver:    %s, %s, devices %s" % (real["path"], version_text(real["version"]), real["devices"]))
    else:
        print("  driver:    NO REAL DRIVER: %s could not be used: %s" % (real["path"], real["error"]))
        print("             the real-driver column will read '-' (not run); pass --driver PATH to choose a library")
    print("  emulator:  %s, %s" % (emulator_path, version_text(emulator["version"])
                                   if emulator["loaded"] else "NOT LOADABLE: %s" % emulator["error"]))
    print()

    real_ok = real["loaded"] and not real["error"]
    if args.sanitizer:
        return run_sanitizer_mode(args, manifest, out_dir, driver_path, real_ok)
    if args.foreign_only:
        return run_foreign(args, manifest, out_dir, driver_path, emulator_path, real_ok)
    if args.bench_only:
        bench = bench_run.run(HERE, manifest, out_dir, driver_path, real_ok, args.bench_quick)
        (out_dir / "bench-summary.json").write_text(json.dumps(bench, indent=2) + "\n")
        if not real_ok:
            return 2
        return 1 if bench_run.failed(bench) else 0
    rows = []
    jobs = []
    for entry in ([] if args.python_only else manifest["binaries"]):
        binary = HERE / entry["file"]
        try:
            filters = args.filter or [""]
            tests = [t for t in list_tests(binary) if any(f in t for f in filters)]
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as error:
            print("%s: cannot list tests: %s" % (entry["file"], error))
            rows.append({"binary": binary.name, "test": "(listing)", "role": entry["role"],
                         "real": {"status": FAIL, "output": str(error)}, "emulator": {"status": NOT_RUN}})
            continue
        jobs.extend((entry, binary, name, copy) for name in tests
                    for copy in range(1, max(1, args.repeat) + 1))

    part = ("the Rust tests (--tests-only)" if args.tests_only else
            "the pytest suite (--pytest-only)" if args.pytest_only else
            "the pytest suite, the install check and the demo (--python-only)" if args.python_only else
            "everything")
    # What the summary says of the steps not reached yet: a run stopped from outside (the GPU
    # host's limit on a call) leaves summary.md and summary.json as they were after the last
    # step that ended, saying what had not run.
    pending = {"status": NOT_RUN, "detail": "not reached (the run was stopped before it, or is still running)"}
    state = {"pytest": dict(pending), "install": dict(pending), "demo": [], "finished": False}

    def write_summary():
        return write_usual_summary(out_dir, manifest, real, emulator, emulator_path, smi, real_ok, part,
                                   rows, state)

    def run_row(job):
        entry, binary, name, copy = job
        row = {"binary": binary.name, "test": name, "role": entry["role"]}
        if args.repeat > 1:
            row["copy"] = copy
        if not real_ok:
            row["real"] = {"status": NOT_RUN}
        elif entry["role"] == "emulator-only":
            row["real"] = {"status": SKIP}
        else:
            row["real"] = run_test(binary, name, driver_env(driver_path), args.timeout)
        if entry["role"] in ("conformance", "emulator-only") and emulator["loaded"]:
            row["emulator"] = run_test(binary, name, driver_env(emulator_path), args.timeout)
        else:
            row["emulator"] = {"status": NOT_RUN}
        print("  %-8s %-8s %s :: %s%s" % (row["real"]["status"], row["emulator"]["status"], binary.name, name,
                                         " (copy %d)" % copy if args.repeat > 1 else ""), flush=True)
        return row

    def row_ended(row):
        """Keeps a row that ended: its logs written and the summary rewritten at once."""
        write_row_logs(out_dir, row)
        rows.append(row)
        write_summary()

    write_summary()
    # Every test is its own process (a context per process), so tests may run side by side;
    # --jobs 1 (the default) keeps them strictly one at a time. Rows are kept as each ends.
    order = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = []
        for n, job in enumerate(jobs):
            future = pool.submit(run_row, job)
            order[future] = n
            futures.append(future)
        for done in concurrent.futures.as_completed(futures):
            row = done.result()
            row["_order"] = order[done]
            row_ended(row)
    rows.sort(key=lambda row: row.get("_order", -1))
    for row in rows:
        row.pop("_order", None)

    def python_step(run, no_python, also_skipped_by=()):
        """pytest or the install check on the real driver, unless --tests-only (or a flag in
        `also_skipped_by`), a bundle without the Python package (`no_python` says so) or no real
        driver."""
        if args.tests_only:
            return {"status": NOT_RUN, "detail": "--tests-only"}
        for flag, given in also_skipped_by:
            if given:
                return {"status": NOT_RUN, "detail": flag}
        if not manifest.get("python"):
            return {"status": SKIP, "detail": no_python}
        if not real_ok:
            return {"status": NOT_RUN, "detail": "no real driver"}
        return run(manifest, driver_env(driver_path), out_dir)

    def pytest_with_own_rows(manifest, env, out_dir):
        result, _ = run_pytest(manifest, env, out_dir, (args.pytest_timeout, args.timeout),
                               on_row=row_ended)
        return result

    state["pytest"] = python_step(pytest_with_own_rows,
                                  "the bundle has no Python package (pybind does not exist yet)")
    write_summary()
    print("\n  pytest: %s (%s)" % (state["pytest"]["status"], state["pytest"].get("detail", "")))
    state["install"] = python_step(run_install_check, "the bundle has no Python package",
                                   (("--pytest-only", args.pytest_only),))
    write_summary()
    print("  install: %s (%s)" % (state["install"]["status"], state["install"].get("detail", "")))

    skip_demo = args.tests_only or args.pytest_only
    if skip_demo:
        state["demo"] = []
    else:
        state["demo"] = run_demo(manifest, real_ok, driver_path, emulator_path,
                                 emulator["loaded"] and not emulator["error"], out_dir,
                                 args.timeout)
        print("\n  demo (output in %s):" % (out_dir / "demo"))
    demo = state["demo"]
    for row in demo:
        print("  %-8s %-8s %s" % (row["real"]["status"], row["emulator"]["status"], row["name"]))
        for column in ("real", "emulator"):
            if row[column]["status"] not in (PASS, SKIP, NOT_RUN):
                print("           %s: %s" % (column, row[column].get("detail", "")))
    state["finished"] = True
    totals, disagreements = write_summary()
    pytest, install = state["pytest"], state["install"]
    failed_statuses = (FAIL, TIMEOUT, CRASH)

    print()
    print("results in %s (summary.md, summary.json, logs/)" % out_dir)
    if disagreements:
        print("emulator disagreements: %d" % len(disagreements))
        for row in disagreements:
            print("  %s" % row["test"])
    if not real_ok:
        print("real driver: NOT RUN (no real driver could be loaded: %s)" % real["error"])
    else:
        print("real driver: %(passed)d passed, %(failed)d failed, %(skipped)d skipped" % totals["real"])
    print("emulator: %(passed)d passed, %(failed)d failed" % totals["emulator"])

    demo_failed = sum(1 for row in demo for column in ("real", "emulator")
                      if row[column]["status"] in failed_statuses)
    if skip_demo:
        print("demo: not run (%s)" % ("--tests-only" if args.tests_only else "--pytest-only"))
    else:
        print("demo: %s (output in %s)" % ("%d run(s) failed" % demo_failed if demo_failed else "passed",
                                            out_dir / "demo"))

    foreign_status = 0
    if args.foreign_tests:
        foreign_status = run_foreign(args, manifest, out_dir, driver_path, emulator_path, real_ok)

    bench_failed = 0
    if args.bench:
        bench = bench_run.run(HERE, manifest, out_dir, driver_path, real_ok, args.bench_quick)
        (out_dir / "bench-summary.json").write_text(json.dumps(bench, indent=2) + "\n")
        bench_failed = bench_run.failed(bench)

    if not real_ok:
        return 2
    failed = (totals["real"]["failed"] + totals["emulator"]["failed"] + (pytest["status"] == FAIL)
              + (install["status"] == FAIL)
              + (pytest["status"] == TIMEOUT) + demo_failed + bench_failed)
    return 1 if failed else 0


# --- Self-test (`python3 run.py --self-test`; xtask/tests/bundle_runner.rs runs it) -----------------

_FAKE_SANITIZER = r"""
import os, subprocess, sys
args = sys.argv[1:]
log = args[args.index("--log-file") + 1]
program = args[args.index("--") + 1:]
ran = subprocess.run(program)
with open(log.replace("%p", str(os.getpid())), "w") as f:
    f.write("========= COMPUTE-SANITIZER\n"
            "========= Leaked 64 bytes at 0x7f0000000000\n"
            "=========     Saved host backtrace up to driver entry point at allocation time\n"
            "=========\n"
            "========= LEAK SUMMARY: 64 bytes leaked in 1 allocations\n"
            "========= ERROR SUMMARY: 1 error\n")
sys.exit(ran.returncode)
"""

_HANGING_PYTHON = r"""
import faulthandler, multiprocessing, signal, sys, time

def child_waits_for_ever():
    faulthandler.register(signal.SIGUSR2, file=sys.__stderr__, all_threads=True, chain=False)
    time.sleep(3600)

if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR2, file=sys.__stderr__, all_threads=True, chain=False)
    child = multiprocessing.get_context("spawn").Process(target=child_waits_for_ever)
    child.start()
    print("started", flush=True)
    child.join()
"""


# A stand-in test binary for the self-test of the usual run: lists three tests; `a::fails`
# fails, `a::observes` passes with an observation, and `a::sees_what_ended` passes only if
# the summary and the failing test's log are already in the output folder when it runs (the
# run writes them as each test ends).
_FAKE_TEST_BINARY = r"""
import json, os, sys
args = sys.argv[1:]
if args[:1] == ["--list"]:
    print("a::fails: test\na::observes: test\na::sees_what_ended: test")
    sys.exit(0)
name = args[args.index("--exact") + 1]
out = os.environ["SELF_TEST_OUT"]
if name == "a::fails":
    print("the failing test's own output")
    sys.exit(101)
if name == "a::observes":
    print("observed: something either way")
if name == "a::sees_what_ended":
    summary = json.load(open(os.path.join(out, "summary.json")))
    ended = [row["test"] for row in summary["tests"]]
    log = os.path.join(out, "logs", "fake", "a.fails.real.log")
    if ended != ["a::fails", "a::observes"] or not os.path.exists(log):
        print("not yet written: tests %r, log there: %r" % (ended, os.path.exists(log)))
        sys.exit(1)
print("test result: ok. 1 passed")
"""

_FAKE_CONFTEST = """
def pytest_configure(config):
    config.addinivalue_line("markers", "own_process: run in a pytest process of its own")
"""

_FAKE_PYTEST = """
import pytest

def test_passes():
    pass

@pytest.mark.own_process
def test_alone():
    pass
"""


def _self_test_parts(tmp):
    """Runs main() on a stand-in bundle (a fake test binary, a two-test pytest suite, a driver
    probe that says the real driver loaded): --tests-only keeps each test's row and log as it
    ends; --pytest-only runs the pytest suite alone (its own-process test a row of its own, the
    suite's log naming each test), no Rust test, install check or demo. Returns the failures."""
    failures = []
    bundle = tmp / "bundle"
    (bundle / "bin").mkdir(parents=True)
    (bundle / "tests").mkdir()
    fake = bundle / "bin" / "fake"
    fake.write_text("#!%s\n%s" % (sys.executable, _FAKE_TEST_BINARY))
    fake.chmod(0o755)
    (bundle / "tests" / "conftest.py").write_text(_FAKE_CONFTEST)
    (bundle / "tests" / "test_fake.py").write_text(_FAKE_PYTEST)
    (bundle / "manifest.json").write_text(json.dumps({
        "commit": "self-test", "built_on": "-", "emulator": "no-emulator.so",
        "binaries": [{"file": "bin/fake", "role": "unit"}],
        "python": {"tests": "tests", "wheels": []}, "demo": {}}))
    saved = {name: globals()[name] for name in ("HERE", "probe_driver", "nvidia_smi")}

    def probe(path):
        if path is None:
            return {"loaded": True, "path": "stand-in", "version": 13000, "devices": ["stand-in"], "error": None}
        return {"loaded": False, "path": str(path), "version": None, "devices": [], "error": "not loaded"}

    globals().update(HERE=bundle, probe_driver=probe, nvidia_smi=lambda: None)
    try:
        out = tmp / "rust"
        os.environ["SELF_TEST_OUT"] = str(out)
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
            status = main(["--tests-only", "--out", str(out)])
        summary = json.loads((out / "summary.json").read_text())
        statuses = {row["test"]: row["real"]["status"] for row in summary["tests"]}
        if status != 1 or statuses != {"a::fails": FAIL, "a::observes": PASS, "a::sees_what_ended": PASS} \
                or not summary["finished"] or summary["pytest"]["status"] != NOT_RUN \
                or not (out / "logs" / "fake" / "a.observes.real.log").exists() \
                or (out / "logs" / "fake" / "a.sees_what_ended.real.log").exists():
            failures.append("--tests-only (status %r): %r; logs %r" % (
                status, statuses, sorted(str(p.relative_to(out)) for p in out.rglob("*.log"))))
        try:
            import pytest  # noqa: F401 (only whether the pytest part can run here)
        except ImportError:
            print("run.py self-test: --pytest-only not checked: this python3 has no pytest")
            return failures
        out = tmp / "pytest"
        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
            status = main(["--pytest-only", "--out", str(out)])
        summary = json.loads((out / "summary.json").read_text())
        rows = [(row["binary"], row["test"], row["real"]["status"]) for row in summary["tests"]]
        log = (out / "logs" / "pytest.real.log").read_text()
        if status != 0 or rows != [("pytest", "test_fake.py::test_alone", PASS)] \
                or summary["pytest"]["status"] != PASS or summary["install"]["status"] != NOT_RUN \
                or summary["demo"] != [] or "test_fake.py::test_passes PASSED" not in log \
                or "--pytest-only" not in (out / "summary.md").read_text():
            failures.append("--pytest-only (status %r): rows %r, pytest %r, install %r, log:\n%s" % (
                status, rows, summary["pytest"], summary["install"], log[-2000:]))
    finally:
        globals().update(saved)
        os.environ.pop("SELF_TEST_OUT", None)
    return failures


def self_test():
    """Checks the parts of --sanitizer, of the hang diagnostics and of the usual run's parts
    that need no GPU: the sanitizer log parser on recorded output, a run under a stand-in
    sanitizer that writes one recorded report, the Python stacks of a hung Python process and
    the child it spawned, and --tests-only and --pytest-only on a stand-in bundle (rows and logs
    written as each test ends). Returns the failures (none: [])."""
    failures = ["sanitizer parser: " + f for f in sanitizer_module().self_test()]
    san = sanitizer_module()
    with tempfile.TemporaryDirectory(prefix="custody-run-self-test-") as tmp:
        tmp = Path(tmp)
        fake = tmp / "fake-sanitizer.py"
        fake.write_text(_FAKE_SANITIZER)
        wrapper = tmp / "compute-sanitizer"
        wrapper.write_text("#!/bin/sh\nexec %s %s \"$@\"\n" % (sys.executable, fake))
        wrapper.chmod(0o755)
        ran = run_sanitized(san, str(wrapper), "memcheck",
                            [sys.executable, "-c", "print('test result: ok. 1 passed')"],
                            dict(os.environ), 60, judge_rust_test, tmp / "sanitizer" / "x", "a::test")
        if ran["status"] != PASS or ran["sanitizer"]["counts"] != {"leak": 1} \
                or ran["sanitizer"]["leaked_bytes"] != 64 or len(ran["sanitizer"]["logs"]) != 1:
            failures.append("a run under the stand-in sanitizer: %r" % {k: v for k, v in ran.items() if k != "output"})
        found = {"path": str(wrapper), "found_by": "a test", "version": "stand-in", "looked": []}
        status = sanitizer_summary(None, {}, tmp, san, found, True,
                                   [{"binary": "x", "test": "a::test", "tool": "memcheck", "real": ran}])
        table = [line for line in (tmp / "summary.md").read_text().splitlines() if line.startswith("|")]
        if status != 1 or len(table) != 3 or len({line.count(" | ") for line in table}) != 1 \
                or "| leak |" not in table[0] or not table[2].startswith("| x | a::test | memcheck | pass | 1 | 1 |"):
            failures.append("the summary of a run with a report (status %r):\n%s" % (status, "\n".join(table)))
        script = tmp / "hangs.py"
        script.write_text(_HANGING_PYTHON)
        hung = run_process([sys.executable, script], dict(os.environ), 5, judge_program)
        dumped = [line for line in hung["output"].splitlines()
                  if "every thread's Python stack dumped" in line]
        if hung["status"] != TIMEOUT or len(dumped) < 2 or "child_waits_for_ever" not in hung["output"]:
            failures.append("a hung Python process and its child: %s" % hung["output"][-3000:])
        failures += ["the usual run's parts: " + f for f in _self_test_parts(tmp)]
    return failures


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(sanitizer_module().report_self_test("run.py", self_test(), "passed"))
    sys.exit(main())
