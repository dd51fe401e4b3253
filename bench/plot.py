#!/usr/bin/env python3
"""Plots of a `qgemm bench` result (the --json document, tools/harness/bench/results.hpp).

    python3 bench/plot.py RESULTS.json OUT.png      (qgemm bench ... --plot OUT.png runs this)

OUT.png           one panel per case: each backend's speedup over cublas-bf16 (the cublas-bf16
                  median divided by the backend's) against M; above 1 is faster.
OUT_roofline.png  every timed run as achieved TFLOPS against arithmetic intensity (FLOPs per
                  byte of the least traffic a call needs: weight + activations + output), under
                  the ceilings measured in the same run: the device copy bandwidth (slope) and
                  the cuBLAS BF16 and cuBLASLt FP8 rates (flat).

Exit status: 0 written, 2 bad arguments, 3 matplotlib is not installed (with a message).
"""
import json
import math
import sys
import textwrap
from pathlib import Path

BASELINE = "cublas-bf16"


def runs_by_case(doc):
    """{(case index, label): [run, ...]} in recipe order."""
    cases = {}
    for run in doc["runs"]:
        cases.setdefault((run["case"], run["label"]), []).append(run)
    return cases


def timed(run):
    return run["status"] == "ok" and run["us"] is not None


def title(doc):
    machine = doc["machine"]
    return f'{doc["recipe"]["name"]} on {machine["gpu"]} ({doc["recipe"]["timing"]}, qgemm {machine["qgemm"]})'


def plot_speedup(plt, doc, path):
    cases = runs_by_case(doc)
    backends = [b for b in doc["recipe"]["backends"] if b != BASELINE]
    columns = min(3, max(1, len(cases)))
    rows = math.ceil(len(cases) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False)
    for axis in axes.flat[len(cases):]:
        axis.set_visible(False)
    for axis, ((_, label), runs) in zip(axes.flat, cases.items()):
        axis.axhline(1.0, color="gray", linestyle="--", linewidth=1, label=BASELINE)
        plotted = False
        for backend in backends:
            points = sorted((r["m"], r["speedup_vs_cublas_bf16"]) for r in runs
                            if r["backend"] == backend and r["speedup_vs_cublas_bf16"] is not None)
            if points:
                axis.plot(*zip(*points), marker="o", label=backend)
                plotted = True
        if not plotted:
            reasons = {r["reason"] for r in runs if r["reason"]}
            # The whole reason, wrapped to the panel's width.
            note = "no timed runs" + (
                ":\n" + "\n".join(textwrap.wrap(sorted(reasons)[0], 48)) if reasons else "")
            axis.text(0.5, 0.5, note, ha="center", va="center", transform=axis.transAxes, fontsize=8)
        axis.set_xscale("log", base=2)
        axis.set_title(label, fontsize=10)
        axis.set_xlabel("M (tokens)")
        axis.set_ylabel(f"speedup over {BASELINE}")
        axis.grid(True, which="both", alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="upper right")
    figure.suptitle(title(doc))
    figure.tight_layout(rect=(0, 0, 0.9, 0.95))
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_roofline(plt, doc, path):
    peaks = doc["peaks"]
    points = {}
    for run in doc["runs"]:
        if timed(run) and run["tflops"] is not None:
            points.setdefault(run["backend"], []).append((run["arithmetic_intensity"], run["tflops"]))
    figure, axis = plt.subplots(figsize=(8, 5.5))
    intensities = [x for values in points.values() for x, _ in values] or [1.0, 1000.0]
    low, high = min(intensities) / 2, max(intensities) * 2
    grid = [low * (high / low) ** (i / 200) for i in range(201)]
    bandwidth = peaks["copy_gbps"]
    for name, rate, style in (("cuBLAS BF16", peaks["bf16_tflops"], "-"),
                              ("cuBLASLt FP8", peaks["fp8_tflops"], "-.")):
        if rate is None:
            continue
        # TFLOPS reachable at intensity x: the compute rate, or x FLOP/B times the bandwidth.
        ceiling = [min(rate, x * bandwidth / 1000) if bandwidth else rate for x in grid]
        axis.plot(grid, ceiling, color="black", linestyle=style, linewidth=1,
                  label=f"{name} {rate:.0f} TFLOPS" + (f", copy {bandwidth:.0f} GB/s" if bandwidth else ""))
    for backend, values in points.items():
        axis.scatter(*zip(*values), label=backend, s=18)
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("arithmetic intensity (FLOP per byte of minimum traffic)")
    axis.set_ylabel("achieved TFLOPS")
    axis.set_title(title(doc), fontsize=10)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only, no display needed
        import matplotlib.pyplot as plt
    except ImportError as error:
        print(f"plot.py: matplotlib is not installed ({error}); install it with "
              "'pip install matplotlib' or 'apt install python3-matplotlib'", file=sys.stderr)
        return 3
    doc = json.loads(Path(argv[1]).read_text())
    out = Path(argv[2])
    roofline = out.with_name(out.stem + "_roofline" + (out.suffix or ".png"))
    plot_speedup(plt, doc, out)
    plot_roofline(plt, doc, roofline)
    print(f"plot.py: wrote {out} and {roofline}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
