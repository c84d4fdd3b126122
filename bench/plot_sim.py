#!/usr/bin/env python3
"""Per-node utilisation and link occupancy over time, from `scd-bench simulate` (bench/cluster_sim.h).

    python3 bench/plot_sim.py SIMULATE_JSON OUT_PNG

Panels, each against simulated time (the JSON's `timeline_bin_s` bins): consumers' busy share,
producers' busy share, producers' link occupancy -- each a heat map, a row per node (sorted by
its mean, busiest on top), over a line of the pool's mean and its 10th-90th percentile band.
A node at 1.0 computed (or its link carried) the whole bin. Uses Debian's python3-matplotlib
(Agg backend).
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_soak import percentile  # noqa: E402  (numpy's linear interpolation, written once)


def rows(nodes, role, key):
    out = [n[key] for n in nodes if n["role"] == role and key in n]
    out.sort(key=lambda r: sum(r) / max(len(r), 1), reverse=True)
    return out


def panel(heat_ax, line_ax, data, bin_s, title, cmap):
    if not data:
        heat_ax.set_axis_off()
        line_ax.set_axis_off()
        heat_ax.set_title(f"{title}: none")
        return
    bins = len(data[0])
    end = bins * bin_s
    image = heat_ax.imshow(data, aspect="auto", interpolation="nearest", cmap=cmap, vmin=0,
                           vmax=1, extent=(0, end, len(data), 0))
    heat_ax.set_ylabel("node (busiest on top)")
    heat_ax.set_title(f"{title}: {len(data)} nodes")
    # One colour bar for the heat map and its line, so that both keep the same width.
    plt.colorbar(image, ax=[heat_ax, line_ax], pad=0.01, fraction=0.03, label="share of the bin")
    times = [(i + 0.5) * bin_s for i in range(bins)]
    columns = list(zip(*data))
    mean = [sum(c) / len(c) for c in columns]
    line_ax.fill_between(times, [percentile(c, 10) for c in columns],
                         [percentile(c, 90) for c in columns], alpha=0.25, label="p10-p90")
    line_ax.plot(times, mean, label="mean")
    line_ax.set_xlim(0, end)
    line_ax.set_ylim(0, 1.02)
    line_ax.set_ylabel("share")
    line_ax.legend(loc="upper right", fontsize=8)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        run = json.load(f)
    bin_s = run["timeline_bin_s"]
    nodes = run["nodes"]
    panels = [("consumers busy", rows(nodes, "consumer", "busy_over_time"), "viridis"),
              ("producers busy", rows(nodes, "producer", "busy_over_time"), "viridis"),
              ("producers' links occupied", rows(nodes, "producer", "link_over_time"), "magma")]
    fig, axes = plt.subplots(6, 1, figsize=(11, 14), sharex=True, constrained_layout=True,
                             gridspec_kw={"height_ratios": [3, 1, 3, 1, 3, 1]})
    for i, (title, data, cmap) in enumerate(panels):
        panel(axes[2 * i], axes[2 * i + 1], data, bin_s, title, cmap)
    axes[-1].set_xlabel(f"simulated time (s; bins of {bin_s:g} s)")
    fig.suptitle(f"scd-bench simulate: {run['requests']} requests, goodput "
                 f"{run['goodput']:.1f}/s, {len(nodes)} nodes", fontsize=11)
    fig.savefig(sys.argv[2], dpi=90)


if __name__ == "__main__":
    main()
