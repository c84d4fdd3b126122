#!/usr/bin/env python3
"""TTFT against time over a bandwidth trace, from `scd-bench sweep --bandwidth-trace`.

    python3 bench/plot_trace.py DIR

Reads DIR/trace.jsonl and writes DIR/trace.png: one panel per consumer, every request's server
TTFT (log y) at its start time, one colour per mode (auto's choices marked by shape: circle local,
square raw, triangle a frontier point; its predictions as crosses), and the trace's rate as a
step line on a second axis. Uses Debian's python3-matplotlib (Agg backend).
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"local": "#555555", "raw": "#d62728", "int4": "#ff7f0e", "recompute": "#9467bd",
          "reuse": "#2ca02c", "scd": "#1f77b4", "auto": "#000000"}
MARKERS = {"local": "o", "raw": "s"}


def rate(value):
    return None if value == "inf" else float(value)


def main():
    out = sys.argv[1]
    records = [json.loads(line) for line in open(os.path.join(out, "trace.jsonl"),
                                                 encoding="utf-8") if line.strip()]
    consumers = sorted({r["consumer"] for r in records})
    if not consumers:
        return
    fig, axes = plt.subplots(len(consumers), 1, figsize=(9, 4.5 * len(consumers)), squeeze=False)
    for ax, consumer in zip(axes[:, 0], consumers):
        mine = [r for r in records if r["consumer"] == consumer and r["ok"]]
        for mode in sorted({r["mode"] for r in mine}):
            rows = [r for r in mine if r["mode"] == mode]
            for choice_kind in sorted({r["mode_used"] for r in rows}):
                part = [r for r in rows if r["mode_used"] == choice_kind]
                marker = MARKERS.get(choice_kind, "^") if mode == "auto" else "o"
                label = f"{mode} ({choice_kind})" if mode == "auto" else mode
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
