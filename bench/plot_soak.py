#!/usr/bin/env python3
"""The timeline of a soak under faults, from `scd-bench soak` (bench/soak.h).

    python3 bench/plot_soak.py SOAK_JSON OUT_PNG

Top panel: streams ended per second by outcome (stacked: ok, ended by the client, ended by their
short deadline, failed and explained by a fault, failed unexplained). Bottom panel: TTFT p99 over
5 s bins (log y) and every stream's TTFT as a faint dot. Each fault's window -- from its start to
its recovery -- is shaded on both panels and labelled with its kind and node. Uses Debian's
python3-matplotlib (Agg backend).
"""
import json
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OUTCOMES = [("ok", "#2ca02c"), ("client_ended", "#7f7f7f"), ("deadline", "#bcbd22"),
            ("explained", "#ff7f0e"), ("unexplained", "#d62728")]
FAULT_COLORS = {"kill": "#d62728", "freeze": "#1f77b4", "flap": "#9467bd", "etcd": "#8c564b",
                "link-down": "#e377c2",
                "replace": "#17becf"}


def percentile(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    rank = (len(values) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (rank - lo)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        report = json.load(f)
    cols = report["stream_columns"]
    idx = {name: i for i, name in enumerate(cols)}
    streams = report["streams"]
    load_s = report["load_s"]
    seconds = int(math.ceil(load_s)) + 1
    counts = {name: [0] * seconds for name, _ in OUTCOMES}
    for row in streams:
        second = min(seconds - 1, max(0, int(row[idx["ended_s"]])))
        counts[row[idx["outcome"]]][second] += 1

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(13, 7), sharex=True,
                                      gridspec_kw={"height_ratios": [1.2, 1]})
    xs = list(range(seconds))
    bottoms = [0] * seconds
    for name, color in OUTCOMES:
        top.bar(xs, counts[name], bottom=bottoms, width=1.0, color=color, label=name,
                linewidth=0)
        bottoms = [b + c for b, c in zip(bottoms, counts[name])]
    top.set_ylabel("streams ended / s")
    # Streams that went on past a fault: moved to another replica, resumed through another
    # coordinator (marked where they ended, above the bars).
    if "moves" in idx:
        peak = max(bottoms) if bottoms else 1
        for key, marker, color, label in (("moves", "v", "#9467bd", "moved"),
                                          ("resumes", "^", "#17becf", "resumed")):
            ended = [r[idx["ended_s"]] for r in streams if r[idx[key]] > 0]
            if ended:
                top.scatter(ended, [peak * 1.05] * len(ended), marker=marker, s=18, color=color,
                            label="%s (%d)" % (label, len(ended)), zorder=3)
    top.legend(loc="upper right", ncol=7, fontsize=8)

    dots_x = [r[idx["sent_s"]] for r in streams if r[idx["ttft_ms"]] > 0]
    dots_y = [r[idx["ttft_ms"]] for r in streams if r[idx["ttft_ms"]] > 0]
    bottom.scatter(dots_x, dots_y, s=3, color="#1f77b4", alpha=0.25, linewidths=0,
                   label="a stream's TTFT")
    bin_s = 5
    bins = {}
    for x, y in zip(dots_x, dots_y):
        bins.setdefault(int(x // bin_s), []).append(y)
    bx = sorted(bins)
    bottom.plot([b * bin_s + bin_s / 2 for b in bx], [percentile(bins[b], 99) for b in bx],
                color="black", linewidth=1.2, label="TTFT p99 (5 s bins)")
    bottom.set_yscale("log")
    bottom.set_ylabel("TTFT (ms)")
    bottom.set_xlabel("seconds since the load started")
    bottom.legend(loc="upper right", fontsize=8)

    for fault in report["faults"]:
        start = fault["start_s"]
        end = fault["recovered_s"] if fault["recovered_s"] >= 0 else load_s
        color = FAULT_COLORS.get(fault["kind"], "#999999")
        for ax in (top, bottom):
            ax.axvspan(start, end, color=color, alpha=0.15, linewidth=0)
        label = fault["kind"] + (" " + fault["node"] if fault["node"] else " link")
        top.text(start, 1.0, label, transform=top.get_xaxis_transform(), rotation=90,
                 fontsize=7, va="top", ha="left", color=color)

    tally = report["tally"]
    outcomes = tally["outcomes"]
    fig.suptitle("soak under faults: %s -- %d requests, %d unexplained, %d wrong-token, "
                 "%d faults" % (report["verdict"].upper(), tally["requests"],
                                outcomes.get("unexplained", 0), tally["wrong_tokens"],
                                len(report["faults"])))
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
