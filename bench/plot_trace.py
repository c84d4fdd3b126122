#!/usr/bin/env python3
"""TTFT against time over a bandwidth trace, from `scd-bench sweep --bandwidth-trace`.

    python3 bench/plot_trace.py DIR

Reads DIR/trace.jsonl and writes DIR/trace.png: one panel per consumer, every request's server
TTFT (log y) at its start time, one colour per mode (auto's choices marked by shape: circle local,
square raw, triangle a frontier point; its predictions as crosses), and the trace's rate as a
step line on a second axis. With a paired replay (`--trace-paired`: mode auto-kept-replay), a
second panel per consumer puts each request auto sent a point for against its replay: adapted
TTFT over kept TTFT, the diagonal, and which pairs had layers lowered. Uses Debian's
python3-matplotlib (Agg backend).
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"local": "#555555", "raw": "#d62728", "int4": "#ff7f0e", "recompute": "#9467bd",
          "reuse": "#2ca02c", "scd": "#1f77b4", "auto": "#000000", "auto-keep": "#8c564b",
          "auto-kept-replay": "#e377c2"}
MARKERS = {"local": "o", "raw": "s"}
CHOOSING = ("auto", "auto-keep", "auto-kept-replay")  # marked by what they ran as


def rate(value):
    return None if value == "inf" else float(value)


def plot_pairs(ax, records, consumer):
    """Adapted against kept TTFT for each request auto sent a point for, and its replay."""
    pairs = []
    for r in records:
        of = r.get("replay_of", -1)
        if r["consumer"] != consumer or of < 0 or not r["ok"]:
            continue
        a = records[of]
        if a["ok"] and a["mode_used"] == "scd":
            pairs.append((r["ttft_ms"], a["ttft_ms"], a["lowered_layers"] > 0))
    if not pairs:
        ax.set_axis_off()
        return
    for lowered, color, label in ((True, "#d62728", "layers lowered"),
                                  (False, "#1f77b4", "sent as chosen")):
        part = [(k, a) for k, a, low in pairs if low == lowered]
        if part:
            ax.scatter([k for k, _ in part], [a for _, a in part], s=22, color=color, label=label)
    lo = min(min(k, a) for k, a, _ in pairs) * 0.9
    hi = max(max(k, a) for k, a, _ in pairs) * 1.1
    ax.plot([lo, hi], [lo, hi], color="#777777", linewidth=0.8, label="equal")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("kept at its ranks: TTFT (ms)")
    ax.set_ylabel("adapted: TTFT (ms)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(f"the same point, the same trace instants ({len(pairs)} pairs)", fontsize=10)


def main():
    out = sys.argv[1]
    records = [json.loads(line) for line in open(os.path.join(out, "trace.jsonl"),
                                                 encoding="utf-8") if line.strip()]
    consumers = sorted({r["consumer"] for r in records})
    if not consumers:
        return
    paired = any(r.get("replay_of", -1) >= 0 for r in records)
    cols = 2 if paired else 1
    fig, axes = plt.subplots(len(consumers), cols, figsize=(9 + 5 * (cols - 1), 4.5 * len(consumers)),
                             squeeze=False,
                             gridspec_kw={"width_ratios": [9, 5]} if paired else None)
    for row, consumer in enumerate(consumers):
        if paired:
            plot_pairs(axes[row, 1], records, consumer)
        ax = axes[row, 0]
        mine = [r for r in records if r["consumer"] == consumer and r["ok"]]
        for mode in sorted({r["mode"] for r in mine}):
            rows = [r for r in mine if r["mode"] == mode]
            for choice_kind in sorted({r["mode_used"] for r in rows}):
                part = [r for r in rows if r["mode_used"] == choice_kind]
                marker = MARKERS.get(choice_kind, "^") if mode in CHOOSING else "o"
                label = f"{mode} ({choice_kind})" if mode in CHOOSING else mode
                ax.scatter([r["start_s"] for r in part], [r["ttft_ms"] for r in part], s=18,
                           color=COLORS.get(mode, "#777777"), marker=marker, label=label)
            predicted = [r for r in rows if r["predicted_ttft_ms"] > 0]
            if predicted:
                ax.scatter([r["start_s"] for r in predicted],
                           [r["predicted_ttft_ms"] for r in predicted], s=18, marker="x",
                           color=COLORS.get(mode, "#777777"), alpha=0.6,
                           label=f"{mode} predicted")
        ax.set_yscale("log")
        ax.set_xlabel("time since the trace started (s)")
        ax.set_ylabel("time to first token (ms, log)")
        ax.grid(True, which="both", alpha=0.3)
        # The trace's rate, as the requests saw it at their start.
        steps = sorted({(r["start_s"], rate(r["gbps_start"])) for r in mine})
        finite = [g for _, g in steps if g is not None]
        if finite:
            top = max(finite) * 10
            twin = ax.twinx()
            twin.step([t for t, _ in steps], [g if g is not None else top for _, g in steps],
                      where="post", color="#2ca02c", alpha=0.5)
            twin.set_yscale("log")
            twin.set_ylabel("link rate at the request's start (Gbit/s; top: unshaped)",
                            fontsize=8)
        ax.legend(fontsize=8, loc="upper left")
        ax.set_title(f"TTFT over a bandwidth trace, consumer {consumer}", fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "trace.png"), dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
