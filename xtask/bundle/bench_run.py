"""The benchmark part of the GPU runner (`run.py --bench` / `--bench-only`).

Runs the bundled release build of `memory/benches/custody_vs_raw` (custody against raw driver
calls, paired and interleaved) and `bench/python_bench.py` (custody against cuda.core, CuPy and
raw cuda-bindings calls, with the bundled wheel) against the real driver, and writes
`<out>/bench/rust.json`, `<out>/bench/python.json` and their logs. Back on the build machine,
`cargo xtask bench --from-results <out>` turns them into docs/benchmarks.md.

Bounded: the Rust benchmark gets at most RUST_LIMIT seconds and the Python one PYTHON_LIMIT
(4 minutes together); a full run took 51 and 43 s on an H200 (d7f8154), before the Python one
measured PyTorch's and CuPy's caching allocators too (importing torch and starting its CUDA
runtime take a few seconds more). Standard library only.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

DRIVER_ENV = "CUSTODY_CUDA_DRIVER"
RUST_LIMIT = 150
PYTHON_LIMIT = 90


def _median(values):
    values = sorted(values)
    n = len(values)
    if not n:
        return None
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def raw_c_pair(rust_json):
    """The median raw pair (`pair` / `raw`) of the Rust benchmark, in ns, or None."""
    try:
        data = json.loads(Path(rust_json).read_text())
    except (OSError, ValueError):
        return None
    for comparison in data.get("comparisons", []):
        if comparison.get("group") == "pair":
            for variant in comparison["variants"]:
                if variant["name"] == "raw":
                    return _median(variant["ns_per_op"])
    return None


def _run(command, env, limit, log):
    """Runs `command` with its whole output going to `log`; returns (status, seconds)."""
    started = time.monotonic()
    try:
        out = subprocess.run(command, env=env, capture_output=True, text=True, errors="replace",
                             timeout=limit)
    except subprocess.TimeoutExpired as expired:
        output = expired.stdout or ""
        if isinstance(output, bytes):
            output = output.decode(errors="replace")
        log.write_text(output + "\n[killed after %d s]\n" % limit)
        return "TIMEOUT", limit
    log.write_text(out.stdout + out.stderr)
    seconds = round(time.monotonic() - started, 1)
    if out.returncode != 0:
        return "FAIL (exit %d, see %s)" % (out.returncode, log), seconds
    return "pass", seconds


def run(here, manifest, out_dir, driver_path, real_ok, quick=False):
    """Runs both benchmarks; returns a dict {rust, python} of {status, seconds, json} rows and
    prints one line per benchmark."""
    bench = manifest.get("bench")
    results = {}
    if not bench:
        print("\n  bench: the bundle has no benchmarks (built by a version without "
              "`cargo xtask bench` support)")
        return {"rust": {"status": "skip", "detail": "no benchmarks in the bundle"}}
    if not real_ok:
        print("\n  bench: NOT RUN (no real driver; pass --driver PATH to run them on another library)")
        return {"rust": {"status": "-", "detail": "no real driver"}}
    bench_dir = out_dir / "bench"
    if bench_dir.exists():
        shutil.rmtree(bench_dir)
    bench_dir.mkdir(parents=True)
    env = dict(os.environ)
    env.pop(DRIVER_ENV, None)
    if driver_path:
        env[DRIVER_ENV] = str(driver_path)
    if quick:
        env["CUSTODY_BENCH_QUICK"] = "1"

    print("\n  bench (output in %s):" % bench_dir, flush=True)
    rust_json = bench_dir / "rust.json"
    criterion_home = Path(tempfile.mkdtemp(prefix="custody-criterion-"))
    try:
        rust_env = dict(env, CUSTODY_BENCH_JSON=str(rust_json), CRITERION_HOME=str(criterion_home))
        status, seconds = _run([str(here / bench["rust"]), "--bench", "--noplot", "--discard-baseline"],
                               rust_env, RUST_LIMIT, bench_dir / "rust.log")
    finally:
        shutil.rmtree(criterion_home, ignore_errors=True)
    if status == "pass" and not rust_json.is_file():
        status = "FAIL (no rust.json written)"
    results["rust"] = {"status": status, "seconds": seconds, "json": "bench/rust.json"}
    print("    %-8s rust   custody_vs_raw (%.0f s)" % (status, seconds), flush=True)

    python = manifest.get("python")
    site = Path(tempfile.mkdtemp(prefix="custody-bench-site-"))
    try:
        for wheel in (python or {}).get("wheels", []):
            with zipfile.ZipFile(here / wheel) as archive:
                archive.extractall(site)
        py_env = dict(env)
        py_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
        if (python or {}).get("torch_allocator"):
            # custody's PyTorch allocator library, for the `PyTorch through custody` variant.
            py_env["CUSTODY_TORCH_ALLOCATOR"] = str(here / python["torch_allocator"])
        command = [sys.executable, str(here / bench["python"]), "--json", str(bench_dir / "python.json")]
        if quick:
            command.append("--quick")
        raw = raw_c_pair(rust_json)
        if raw:
            command += ["--raw-c-ns", "%.1f" % raw]
        status, seconds = _run(command, py_env, PYTHON_LIMIT, bench_dir / "python.log")
    finally:
        shutil.rmtree(site, ignore_errors=True)
    results["python"] = {"status": status, "seconds": seconds, "json": "bench/python.json"}
    print("    %-8s python python_bench (%.0f s)%s" % (status, seconds,
                                                       "" if python else "; no wheel in the bundle: custody skipped"),
          flush=True)
    print("    then, on the build machine: cargo xtask bench --from-results %s" % out_dir)
    return results


def failed(results):
    """How many benchmark runs failed (skips and 'not run' do not count)."""
    return sum(1 for row in results.values()
               if row.get("status") not in ("pass", "skip", "-"))
