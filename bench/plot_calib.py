#!/usr/bin/env python3
"""The figures of `scd-calib eval`, from the CSV files it writes (calib/eval_report.h).

    python3 bench/plot_calib.py depth DIR/depth_errors.csv --title T --out DIR/depth_errors.png
    python3 bench/plot_calib.py rank  DIR/rank_sweep.csv   --title T --out DIR/rank_sweep.png
    python3 bench/plot_calib.py frontier DIR/frontier.csv  --title T --out DIR/frontier.png

depth: relative l2 error of each layer's attention input, reuse vs scd, patch layers marked
(the method paper's Fig. 6). rank: KL against payload over nested (r_K, r_V), the Pareto front
joined. frontier: the artifact's frontier (per-layer ranks, f16/int8/int4 codes) measured on
the evaluation's windows, one marker per precision, the fixed modes beside it.
Debian's python3-matplotlib, Agg backend.
"""
import argparse
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def depth(rows, title, out):
    layers = [int(r["layer"]) for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(layers, [float(r["reuse_rel_error"]) for r in rows], "o-", label="reuse")
    ax.plot(layers, [float(r["scd_rel_error"]) for r in rows], "s-", label="scd")
    patched = [int(r["layer"]) for r in rows if r["route"] == "patch"]
    for i, layer in enumerate(patched):
        ax.axvline(layer, color="#999999", linestyle=":", label="patch layer" if i == 0 else None)
    ax.set_xlabel("layer")
    ax.set_ylabel("relative l2 error of the attention input H")
    ax.set_xticks(layers)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def rank(rows, title, out):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = [100 * float(r["payload_ratio"]) for r in rows]
    ys = [float(r["kl"]) for r in rows]
    ax.scatter(xs, ys, s=18, color="#1f77b4", alpha=0.6, label="(r_K, r_V) grid")
    front = sorted((100 * float(r["payload_ratio"]), float(r["kl"]), r) for r in rows
                   if r["pareto"] == "1")
    ax.plot([f[0] for f in front], [f[1] for f in front], "o-", color="#d62728",
            label="Pareto front")
    for x, y, r in front:
        ax.annotate(f"({r['rank_k']},{r['rank_v']})", (x, y), textcoords="offset points",
                    xytext=(4, 4), fontsize=7)
    ax.set_yscale("log")
    ax.set_xlabel("payload, % of raw f16 KV")
    ax.set_ylabel("KL(oracle || mode) (log)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def frontier(rows, title, out):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    points = sorted((100 * float(r["payload_ratio"]), float(r["kl"]), r) for r in rows
                    if r["kind"] == "frontier")
    ax.plot([p[0] for p in points], [p[1] for p in points], "-", color="#d62728", alpha=0.5,
            label="frontier")
    markers = {"f16": "o", "int8": "s", "int4": "^"}
    for dtype, marker in markers.items():
        sel = [p for p in points if p[2]["code_dtype"] == dtype]
        if sel:
            ax.scatter([p[0] for p in sel], [p[1] for p in sel], marker=marker, s=30,
                       color="#d62728", label=f"frontier, {dtype} codes", zorder=3)
    for x, y, r in points:
        if r["label"].startswith("*"):
            ax.annotate("recommended", (x, y), textcoords="offset points", xytext=(6, 6),
                        fontsize=8)
    colors = {"scd": "#1f77b4", "reuse": "#2ca02c", "int4": "#9467bd", "raw": "#7f7f7f"}
    for r in rows:
        if r["kind"] == "mode":
            ax.scatter([100 * float(r["payload_ratio"])], [float(r["kl"])], marker="D", s=40,
                       color=colors.get(r["label"], "k"), label=f"{r['label']} (fixed)", zorder=4)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("payload, % of raw f16 KV (log)")
    ax.set_ylabel("KL(consumer's own prefill || mode) (log)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["depth", "rank", "frontier"])
    parser.add_argument("csv")
    parser.add_argument("--title", default="")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.csv, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        print(f"plot_calib.py: {args.csv} has no rows", file=sys.stderr)
        return 1
    {"depth": depth, "rank": rank, "frontier": frontier}[args.kind](rows, args.title, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
