#!/usr/bin/env python3
"""Plots of a `scd-bench sweep --out DIR` run, written into DIR.

    python3 bench/plot_sweep.py DIR [--breakdown-bandwidth GBPS]

Reads DIR/summary.csv (medians per consumer, mode and bandwidth) and DIR/sweep.json, writes:
  ttft_vs_bandwidth.png  TTFT against link bandwidth (log x), one line per mode, its lower bound
                         dashed; a second x axis in GPU-equivalent bandwidth with --compute-scale
  ttft_breakdown.png     the TTFT of every mode at one bandwidth, stacked by stage
  quality_vs_ttft.png    greedy-token agreement with the consumer's own prefill against TTFT
  bytes_per_token.png    payload bytes per prompt token, per mode
Uses Debian's python3-matplotlib (Agg backend).
"""
import argparse
import csv
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

MODE_ORDER = ["local", "raw", "int4", "recompute", "reuse", "scd", "auto"]
COLORS = {"local": "#555555", "raw": "#d62728", "int4": "#ff7f0e", "recompute": "#9467bd",
          "reuse": "#2ca02c", "scd": "#1f77b4", "auto": "#000000"}


def load(out):
    with open(os.path.join(out, "summary.csv"), encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    meta = {}
    path = os.path.join(out, "sweep.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    return rows, meta


def bw_value(text, inf_at):
    return inf_at if text == "inf" else float(text)


def modes_of(rows):
    seen = {r["mode"] for r in rows}
    return [m for m in MODE_ORDER if m in seen] + sorted(seen - set(MODE_ORDER))


def finite_bws(rows):
    return sorted({float(r["bandwidth_gbps"]) for r in rows if r["bandwidth_gbps"] != "inf"})


def fidelity_label(meta):
    return "" if meta.get("fidelity", True) else " — dummy weights: timings only, no fidelity"


def plot_ttft(rows, meta, out, consumer):
    bws = finite_bws(rows)
    inf_at = (max(bws) * 10) if bws else 1.0
    fig, ax = plt.subplots(figsize=(8.5, 5.2))
    ys = []
    for mode in modes_of(rows):
        cells = sorted((bw_value(r["bandwidth_gbps"], inf_at), r) for r in rows
                       if r["mode"] == mode and r["consumer"] == consumer and r["ttft_ms"])
        cells = [(x, r) for x, r in cells if float(r["ttft_ms"]) > 0]
        if not cells:
            continue
        xs = [x for x, _ in cells]
        ys += [float(r[k]) for _, r in cells for k in ("ttft_ms", "bound_ms") if float(r[k]) > 0]
        color = COLORS.get(mode)
        ax.plot(xs, [float(r["ttft_ms"]) for _, r in cells], "o-", color=color,
                label=f"{mode} TTFT")
        ax.plot(xs, [float(r["bound_ms"]) for _, r in cells], "--", color=color, alpha=0.7,
                label=f"{mode} bound")
        # auto: what the coordinator predicted when it chose (its cost model).
        predicted = [(x, float(r["predicted_ttft_ms"])) for x, r in cells
                     if r.get("predicted_ttft_ms")]
        if predicted:
            ax.plot([x for x, _ in predicted], [y for _, y in predicted], ":", color=color,
                    marker="x", label=f"{mode} predicted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    # Within a decade every minor tick gets its number (else a narrow range shows one label).
    narrow = bool(ys) and max(ys) < 10 * min(ys)
    ax.yaxis.set_minor_formatter(ticker.FuncFormatter(
        lambda v, _: f"{v:g}" if narrow or str(f"{v:g}")[0] in "25" else ""))
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ticks = bws + [inf_at]
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{b:g}" for b in bws] + ["inf\n(unshaped)"])
    ax.set_xlabel("link bandwidth (Gbit/s, log)")
    ax.set_ylabel("time to first token (ms, log)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(ncol=2, fontsize=8)
    ax.set_title(f"TTFT against link bandwidth, consumer {consumer}{fidelity_label(meta)}",
                 fontsize=10)
    scale = meta.get("compute_scale_tokens_per_s", 0) or 0
    here = meta.get("prefill_tokens_per_s", 0) or 0
    if scale > 0 and here > 0:
        f = scale / here
        top = ax.secondary_xaxis("top", functions=(lambda x: x * f, lambda x: x / f))
        top.set_xlabel(f"GPU-equivalent bandwidth (Gbit/s): a scaling, x {f:.3g} = "
                       f"{scale:g} GPU prefill tok/s / {here:.0f} tok/s measured here",
                       fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "ttft_vs_bandwidth.png"), dpi=110)
    plt.close(fig)


def pick_bandwidth(rows, wanted):
    bws = finite_bws(rows)
    if wanted is not None:
        return min(bws, key=lambda b: abs(math.log(b / wanted))) if bws else "inf"
    # Where raw transfer time is closest to the producer's prefill, preferring bandwidths where it
    # is not below it (the link starts to hold raw back): the interesting crossover, as
    # bench/sweep_check.py picks it.
    best, gap = None, None
    for r in rows:
        if r["mode"] == "raw" and r["bandwidth_gbps"] != "inf" and r["transfer_bound_ms"]:
            pre, tr = float(r["prefill_alone_ms"] or 0), float(r["transfer_bound_ms"] or 0)
            if pre > 0 and tr > 0:
                g = (0 if tr >= pre else 1e3) + abs(math.log(tr / pre))
                if gap is None or g < gap:
                    best, gap = float(r["bandwidth_gbps"]), g
    if best is not None:
        return best
    return bws[len(bws) // 2] if bws else "inf"


def cells_at(rows, consumer, bw):
    key = "inf" if bw == "inf" else None
    out = {}
    for r in rows:
        if r["consumer"] != consumer or not r["ttft_ms"]:
            continue
        if (key and r["bandwidth_gbps"] == "inf") or (
                not key and r["bandwidth_gbps"] != "inf"
                and math.isclose(float(r["bandwidth_gbps"]), bw)):
            out[r["mode"]] = r
    return out


def plot_breakdown(rows, meta, out, consumer, bw, results):
    # Median stage times per mode from the per-request records at this bandwidth.
    stages = ["queue", "prefill", "transfer beyond prefill", "last_rebuild", "first_decode"]
    per_mode = {}
    for rec in results:
        if rec["consumer"] != consumer or not rec["ok"]:
            continue
        b = rec["bandwidth_gbps"]
        if not (b == bw or (b != "inf" and bw != "inf" and math.isclose(float(b), bw))):
            continue
        t = rec["timings_ms"]
        hidden = max(0.0, t["ttft"] - t["queue"] - t["prefill"] - t["last_rebuild"]
                     - t["first_decode"])
        per_mode.setdefault(rec["mode"], []).append(
            [t["queue"], t["prefill"], hidden, t["last_rebuild"], t["first_decode"]])
    modes = [m for m in modes_of(rows) if m in per_mode]
    if not modes:
        return

    def median(values):
        v = sorted(values)
        n = len(v)
        return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2

    fig, ax = plt.subplots(figsize=(8.5, 5))
    bottoms = [0.0] * len(modes)
    colors = ["#bbbbbb", "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e"]
    for i, stage in enumerate(stages):
        heights = [median([row[i] for row in per_mode[m]]) for m in modes]
        ax.bar(modes, heights, bottom=bottoms, color=colors[i], label=stage)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    cells = cells_at(rows, consumer, bw)
    for j, m in enumerate(modes):
        if m in cells:
            ax.plot([j - 0.4, j + 0.4], [float(cells[m]["bound_ms"])] * 2, "k--", linewidth=1)
    ax.plot([], [], "k--", linewidth=1, label="lower bound")
    ax.set_ylabel("time to first token (ms)")
    ax.set_xlabel("transfer mode")
    label = "unshaped" if bw == "inf" else f"{bw:g} Gbit/s"
    ax.set_title(f"TTFT breakdown at {label}, consumer {consumer}{fidelity_label(meta)}",
                 fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "ttft_breakdown.png"), dpi=110)
    plt.close(fig)


def plot_quality(rows, meta, out, consumer, bw):
    fig, ax = plt.subplots(figsize=(7, 5))
    cells = cells_at(rows, consumer, bw)
    if not meta.get("fidelity", True):
        ax.text(0.5, 0.5, "no fidelity: dummy weights\n(timings only)", ha="center",
                va="center", transform=ax.transAxes, fontsize=14)
    else:
        for mode, r in cells.items():
            if r["agreement"] == "":
                continue
            x, y = float(r["ttft_ms"]), float(r["agreement"]) * 100
            ax.scatter([x], [y], color=COLORS.get(mode), s=60, label=mode)
            kl = r["first_kl"]
            ax.annotate(f"{mode}" + (f"\nKL {float(kl):.3f}" if kl else ""), (x, y),
                        textcoords="offset points", xytext=(6, 4), fontsize=8)
        ax.legend(fontsize=8)
    label = "unshaped" if bw == "inf" else f"{bw:g} Gbit/s"
    ax.set_xlabel(f"time to first token at {label} (ms)")
    ax.set_ylabel("greedy-token agreement with own prefill, first 32 tokens (%)")
    ax.set_ylim(-5, 105)
    ax.grid(True, alpha=0.3)
    ax.set_title(f"Quality against TTFT, consumer {consumer}", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "quality_vs_ttft.png"), dpi=110)
    plt.close(fig)


def plot_bytes(rows, meta, out, consumer):
    per_mode = {}
    for r in rows:
        if (r["consumer"] == consumer and r["mode_used"] not in ("", "local")
                and float(r["bytes_per_token"] or 0) > 0):
            per_mode.setdefault(r["mode"], float(r["bytes_per_token"]))
    modes = [m for m in modes_of(rows) if m in per_mode]
    if not modes:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    values = [per_mode[m] for m in modes]
    bars = ax.bar(modes, values, color=[COLORS.get(m, "#777777") for m in modes])
    for bar, v in zip(bars, values):
        ax.annotate(f"{v:,.0f}", (bar.get_x() + bar.get_width() / 2, v), ha="center",
                    va="bottom", fontsize=8)
    ax.set_ylabel("payload bytes per prompt token")
    ax.set_xlabel("transfer mode")
    ax.set_title(f"Bytes on the link per token, consumer {consumer}{fidelity_label(meta)}",
                 fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "bytes_per_token.png"), dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the sweep's --out directory")
    parser.add_argument("--breakdown-bandwidth", type=float, default=None,
                        help="Gbit/s for the breakdown and quality plots (default: where raw "
                             "transfer time is nearest the prefill)")
    args = parser.parse_args()
    rows, meta = load(args.out)
    if not rows:
        print("plot_sweep.py: summary.csv has no rows", file=sys.stderr)
        return 1
    results = []
    with open(os.path.join(args.out, "results.jsonl"), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                results.append(json.loads(line))
    consumer = rows[0]["consumer"]
    bw = pick_bandwidth([r for r in rows if r["consumer"] == consumer], args.breakdown_bandwidth)
    plot_ttft(rows, meta, args.out, consumer)
    plot_breakdown(rows, meta, args.out, consumer, bw, results)
    plot_quality(rows, meta, args.out, consumer, bw)
    plot_bytes(rows, meta, args.out, consumer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
