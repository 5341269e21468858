#!/usr/bin/env python3
"""Instructions per operation of `bench/python_bench.py` variants (or, with `--rust`, of the
Rust benchmark's, `memory/benches/custody_vs_raw`), counted by callgrind.

For each variant, runs `python_bench.py --only VARIANT` under `valgrind --tool=callgrind` twice,
with N and 2N operations, and reports the difference divided by N: import, setup and warm-up
cancel, and instruction counts repeat from run to run on a loaded machine, unlike times (the
hash seed is fixed, and OpenBLAS, which cuda.core's numpy loads, gets one thread, whose
spinning would otherwise be counted). The
attribution is the same difference per function (self cost, callgrind_annotate's), summed by
shared object and listed for the largest functions.

Every argument after `--` goes to python_bench.py (for example `--compare custody_before`).
The driver is python_bench.py's: `CUSTODY_CUDA_DRIVER`, and `libcuda.so.1` on LD_LIBRARY_PATH
for cuda.core and cuda-bindings (the stub driver, bench/stub_driver.c, keeps the driver's
share small). Standard library only; needs valgrind and callgrind_annotate.

With `--rust`, a VARIANT is `group/variant` or `group/param/variant` as the Rust benchmark
names them (`pair/handle`, `threads/2/buffer, close`); the release benchmark binary is built
(`cargo bench --no-run`) and run in its counting mode (`CUSTODY_BENCH_COUNT`,
`CUSTODY_BENCH_VARIANT`: that variant alone, N iterations, no criterion). `--toggle FUNCTION`
(callgrind's `--toggle-collect`, a glob; repeatable) counts only inside those functions: for a
variant whose timed part waits by spinning (`deferred/deferred`, whose own count then varies
from run to run), name what runs per operation (`handles::deferred::consume*`).

  python3 bench/callgrind.py [--ops N] [--top K] [--json PATH] VARIANT... [-- BENCH_ARGS...]
  python3 bench/callgrind.py --rust [--toggle FUNCTION]... [--ops N] VARIANT...
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
LINE = re.compile(r"^\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(\S.*?)\s+\[(.*)\]\s*$")


def rust_binary():
    """Builds the Rust benchmark (release) and returns its executable."""
    command = ["cargo", "bench", "-p", "cuda-custody-memory", "--bench", "custody_vs_raw",
               "--no-run", "--message-format=json-render-diagnostics"]
    done = subprocess.run(command, capture_output=True, text=True, errors="replace",
                          cwd=os.path.dirname(HERE))
    if done.returncode != 0:
        sys.exit("building the Rust benchmark failed:\n%s" % done.stderr[-3000:])
    for line in done.stdout.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if (message.get("reason") == "compiler-artifact"
                and message["target"]["name"] == "custody_vs_raw" and message.get("executable")):
            return message["executable"]
    sys.exit("cargo built no custody_vs_raw executable")


def run_callgrind(variant, ops, bench_args, out, rust=None, toggles=()):
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=%s" % out]
    command += ["--toggle-collect=%s" % t for t in toggles]
    # A fixed hash seed: the same dictionaries and sets every run, so that the two runs differ
    # only in the operations counted.
    env = dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1")
    if rust:
        command += [rust, "--bench"]
        env.update(CUSTODY_BENCH_COUNT=str(ops), CUSTODY_BENCH_VARIANT=variant)
    else:
        command += [sys.executable, os.path.join(HERE, "python_bench.py"), "--only", variant,
                    "--pairs", str(ops)] + bench_args
    done = subprocess.run(command, capture_output=True, text=True, errors="replace", env=env)
    if done.returncode != 0:
        sys.exit("callgrind run failed (%d): %s\n%s" % (done.returncode, " ".join(command),
                                                         (done.stdout + done.stderr)[-3000:]))


def functions(out):
    """{(object, function): self Ir} and the total, from callgrind_annotate."""
    text = subprocess.run(["callgrind_annotate", "--threshold=100", out], capture_output=True,
                          text=True, errors="replace", check=True).stdout
    total, costs = None, {}
    for line in text.splitlines():
        if "PROGRAM TOTALS" in line:
            total = int(line.split()[0].replace(",", ""))
            continue
        match = LINE.match(line)
        if match:
            ir, function, obj = match.groups()
            key = (os.path.basename(obj), function.split(":", 1)[-1])
            costs[key] = costs.get(key, 0) + int(ir.replace(",", ""))
    if total is None:
        sys.exit("no PROGRAM TOTALS in callgrind_annotate's output for %s" % out)
    return total, costs


def measure(variant, ops, bench_args, top, rust=None, toggles=()):
    with tempfile.TemporaryDirectory(prefix="custody-callgrind-") as tmp:
        runs = []
        for n in (ops, 2 * ops):
            out = os.path.join(tmp, "callgrind.%d" % n)
            run_callgrind(variant, n, bench_args, out, rust, toggles)
            runs.append(functions(out))
    (total1, costs1), (total2, costs2) = runs
    per_op = (total2 - total1) / ops
    delta = {key: (costs2.get(key, 0) - costs1.get(key, 0)) / ops
             for key in set(costs1) | set(costs2)}
    by_object = {}
    for (obj, _), ir in delta.items():
        by_object[obj] = by_object.get(obj, 0) + ir
    ranked = sorted(delta.items(), key=lambda kv: -kv[1])[:top]
    return {
        "variant": variant,
        "ops": ops,
        "ir_per_op": round(per_op, 1),
        "by_object": {k: round(v, 1) for k, v in sorted(by_object.items(), key=lambda kv: -kv[1])
                      if abs(v) >= 1},
        "functions": [{"object": obj, "function": fn, "ir_per_op": round(ir, 1)}
                      for (obj, fn), ir in ranked if abs(ir) >= 1],
    }


def main():
    argv = sys.argv[1:]
    bench_args = []
    if "--" in argv:
        at = argv.index("--")
        argv, bench_args = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="+", metavar="VARIANT",
                        help="python_bench.py variant names, e.g. 'custody: allocate+close' "
                             "(with --rust: 'pair/handle')")
    parser.add_argument("--ops", type=int, default=20000, help="N (default 20000)")
    parser.add_argument("--top", type=int, default=25, help="functions listed (default 25)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--rust", action="store_true",
                        help="count the Rust benchmark's variants (group/variant) instead")
    parser.add_argument("--toggle", action="append", default=[], metavar="FUNCTION",
                        help="count only inside FUNCTION (callgrind --toggle-collect; repeatable)")
    args = parser.parse_args(argv)
    rust = rust_binary() if args.rust else None
    results = []
    for variant in args.variants:
        result = measure(variant, args.ops, bench_args, args.top, rust, args.toggle)
        results.append(result)
        print("\n%s: %.0f Ir per operation (difference of %d and %d operations)"
              % (variant, result["ir_per_op"], args.ops, 2 * args.ops))
        for obj, ir in result["by_object"].items():
            print("  %10.0f  %s" % (ir, obj))
        print("  largest functions (self):")
        for f in result["functions"]:
            print("  %10.0f  %s  [%s]" % (f["ir_per_op"], f["function"], f["object"]))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)
            out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
