#!/usr/bin/env python3
"""Draws the PNG plots of one stored benchmark run (docs/benchmarks/<run>/) with matplotlib.

Run by `cargo xtask bench` in .venv: `python bench/plot.py docs/benchmarks/<run>`. Reads the
run's rust.json and python.json (format custody-bench/1) and the summary.json `cargo xtask
bench` computed from them, writes targets.png, pair.png, frees.png, threads.png,
threads-ratio.png, live.png, python.png and python-threads.png next to them (each only when its
data exist), and prints the name of every file it wrote, one a line.
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def median(values):
    values = sorted(v for v in values if v == v)
    n = len(values)
    if not n:
        return float("nan")
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def quantile(values, q):
    values = sorted(v for v in values if v == v)
    if not values:
        return float("nan")
    pos = q * (len(values) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def load(path):
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def colour(name):
    if name.startswith("raw"):
        return "#7f7f7f"
    if "cuda.core" in name:
        return "#76b900"
    if "CuPy" in name:
        return "#1f77b4"
    if "PyTorch" in name:
        return "#ee4c2c"
    return "#d62728"  # custody


def bars(ax, rows, title, unit):
    """rows: [(label, samples)] drawn as horizontal bars at the median with p25-p75 whiskers."""
    labels = [r[0] for r in rows]
    meds = [median(r[1]) for r in rows]
    lo = [m - quantile(r[1], 0.25) for m, r in zip(meds, rows)]
    hi = [quantile(r[1], 0.75) - m for m, r in zip(meds, rows)]
    y = list(range(len(rows)))
    ax.barh(y, meds, xerr=[lo, hi], color=[colour(label.split(" / ")[-1]) for label in labels],
            capsize=3)
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    ax.set_title(title, fontsize=9)
    for yi, m, h in zip(y, meds, hi):
        ax.text(m + (h if h == h else 0), yi, "  %.0f" % m if m >= 100 else "  %.1f" % m, va="center", fontsize=7)
    ax.margins(x=0.12)


def comparisons(suite, group):
    return [c for c in suite["comparisons"] if c["group"] == group] if suite else []


def variant_rows(comparison, prefix=""):
    return [(prefix + v["name"], v["ns_per_op"]) for v in comparison["variants"]]


def device_note(suite):
    d = suite["driver"]
    return "%s%s" % (d["device"], " (EMULATED driver: ratios only)" if d.get("emulated") else "")


def main():
    run_dir = sys.argv[1]
    rust = load(os.path.join(run_dir, "rust.json"))
    python = load(os.path.join(run_dir, "python.json"))
    written = []

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(os.path.join(run_dir, name), dpi=110)
        plt.close(fig)
        written.append(name)

    if rust:
        note = device_note(rust)
        pair = comparisons(rust, "pair") + comparisons(rust, "pair-legacy")
        if pair:
            rows = []
            for c in pair:
                rows += variant_rows(c, "%s / " % c["group"])
            fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.5))
            bars(ax, rows, "alloc+free pair, 256 B, one thread: %s" % note, "ns per pair (median, p25-p75)")
            save(fig, "pair.png")

        frees = comparisons(rust, "drop") + comparisons(rust, "deferred") + comparisons(rust, "set_deallocation_stream")
        if frees:
            fig, axes = plt.subplots(len(frees), 1, figsize=(8, 1.2 + 1.6 * len(frees)))
            axes = axes if len(frees) > 1 else [axes]
            for ax, c in zip(axes, frees):
                bars(ax, variant_rows(c), c["title"], "ns per %s" % c["op"])
            fig.suptitle(note, fontsize=9)
            save(fig, "frees.png")

        threads = comparisons(rust, "threads")
        if threads:
            fig, ax = plt.subplots(figsize=(7, 4))
            counts = [c["param"] for c in threads]
            for v, name in enumerate(v["name"] for v in threads[0]["variants"]):
                mpairs = [1e3 / median(c["variants"][v]["ns_per_op"]) for c in threads]
                ax.plot(counts, mpairs, marker="o", label=name, color=colour(name) if name.startswith("raw") else None)
            ax.set_xscale("log", base=2)
            ax.set_xticks(counts)
            ax.set_xticklabels([str(n) for n in counts])
            ax.set_xlabel("threads (one created stream each)")
            ax.set_ylabel("million alloc+free pairs per second")
            ax.set_ylim(bottom=0)
            ax.set_title("concurrent alloc+free: %s" % note, fontsize=10)
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
            save(fig, "threads.png")

            # Paired ratios: each custody variant's throughput over raw's in the same samples.
            fig, ax = plt.subplots(figsize=(7, 4))
            names = [v["name"] for v in threads[0]["variants"]]
            raw = names.index("raw") if "raw" in names else None
            if raw is not None:
                for v, name in enumerate(names):
                    if v == raw:
                        continue
                    ratios = [median([r / x for r, x in zip(c["variants"][raw]["ns_per_op"],
                                                            c["variants"][v]["ns_per_op"])])
                              for c in threads]
                    ax.plot(counts, ratios, marker="o", label=name,
                            color=colour(name) if name.startswith("raw") else None)
                ax.axhline(0.9, color="black", linestyle=":", linewidth=1)
                ax.text(counts[0], 0.9, " target 0.9 x", fontsize=7, va="bottom")
                ax.axhline(1.0, color="#7f7f7f", linewidth=0.8)
                ax.set_xscale("log", base=2)
                ax.set_xticks(counts)
                ax.set_xticklabels([str(n) for n in counts])
                ax.set_xlabel("threads (one created stream each)")
                ax.set_ylabel("throughput / raw throughput (paired median)")
                ax.set_title("concurrent alloc+free, ratio to raw: %s" % note, fontsize=10)
                ax.legend(fontsize=7)
                ax.grid(alpha=0.3)
                save(fig, "threads-ratio.png")

        live = comparisons(rust, "live")
        if live:
            fig, ax = plt.subplots(figsize=(7, 4))
            counts = [c["param"] for c in live]
            for v, name in enumerate(v["name"] for v in live[0]["variants"]):
                meds = [median(c["variants"][v]["ns_per_op"]) for c in live]
                lo = [m - quantile(c["variants"][v]["ns_per_op"], 0.25) for m, c in zip(meds, live)]
                hi = [quantile(c["variants"][v]["ns_per_op"], 0.75) - m for m, c in zip(meds, live)]
                ax.errorbar(counts, meds, yerr=[lo, hi], marker="o", capsize=3, label=name,
                            color=colour(name) if name.startswith("raw") else None)
            ax.set_xscale("log")
            ax.set_xlabel("other buffers alive in the pool")
            ax.set_ylabel("ns per alloc+free pair")
            ax.set_ylim(bottom=0)
            ax.set_title("pair cost with live buffers: %s" % note, fontsize=10)
            ax.legend()
            ax.grid(alpha=0.3)
            save(fig, "live.png")

    if python:
        rows = []
        for c in python["comparisons"]:
            if c["group"] != "py-threads":
                rows += variant_rows(c)
        if rows:
            fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.5))
            bars(ax, rows, "Python, 256 B, one created stream: %s" % device_note(python),
                 "ns per pair / call (median, p25-p75)")
            raw_c = python.get("raw_c_pair_ns")
            if raw_c:
                ax.axvline(raw_c, color="black", linestyle=":", linewidth=1)
                ax.text(raw_c, len(rows) - 0.5, " raw C pair", fontsize=7)
            save(fig, "python.png")

        threads = comparisons(python, "py-threads")
        if threads:
            fig, ax = plt.subplots(figsize=(7, 4))
            counts = [c["param"] for c in threads]
            for name in [v["name"] for v in threads[0]["variants"]]:
                points = [(c["param"], median(v["ns_per_op"])) for c in threads
                          for v in c["variants"] if v["name"] == name]
                ax.plot([p for p, _ in points], [1e3 / m for _, m in points], marker="o", label=name,
                        color=colour(name) if name.startswith("raw") else None)
            ax.set_xscale("log", base=2)
            ax.set_xticks(counts)
            ax.set_xticklabels([str(n) for n in counts])
            ax.set_xlabel("Python threads (one created stream each)")
            ax.set_ylabel("million allocate+close pairs per second")
            ax.set_ylim(bottom=0)
            ax.set_title("Python, concurrent allocate+close: %s" % device_note(python), fontsize=10)
            ax.legend()
            ax.grid(alpha=0.3)
            save(fig, "python-threads.png")

    summary = load(os.path.join(run_dir, "summary.json"))
    targets = [t for t in (summary or {}).get("targets", []) if t.get("value") is not None]
    if targets:
        # One row per measured target: its value (green met, red missed) and its limit.
        units = sorted({t["limit"]["unit"] for t in targets}, key=lambda u: u != "x")
        fig, axes = plt.subplots(len(units), 1, squeeze=False,
                                 figsize=(9, 1.2 + 0.45 * len(targets) + 0.6 * len(units)))
        for ax, unit in zip(axes[:, 0], units):
            rows = [t for t in targets if t["limit"]["unit"] == unit]
            y = list(range(len(rows)))
            for yi, t in zip(y, rows):
                limit = t["limit"].get("at_most", t["limit"].get("at_least"))
                sign = "≤" if "at_most" in t["limit"] else "≥"
                ax.plot([t["value"]], [yi], "o", color="#2ca02c" if t["met"] else "#d62728")
                ax.plot([limit, limit], [yi - 0.35, yi + 0.35], color="black", linewidth=1.5)
                ax.text(t["value"], yi + 0.25, " %.3g %s" % (t["value"], unit), fontsize=7)
                ax.text(limit, yi - 0.3, " %s %.3g" % (sign, limit), fontsize=7)
            ax.set_yticks(y)
            ax.set_yticklabels([t["target"] for t in rows], fontsize=7)
            ax.invert_yaxis()
            ax.set_xlabel("ratio (x)" if unit == "x" else unit)
            ax.grid(axis="x", alpha=0.3)
            ax.margins(x=0.15, y=0.2)
        fig.suptitle("targets, each measured side by side in one run: %s"
                     % (device_note(rust or python)), fontsize=9)
        save(fig, "targets.png")

    for name in written:
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
