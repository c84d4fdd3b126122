#!/usr/bin/env python3
"""TTFT and TPOT against the request rate, from `scd-bench serve --out DIR` JSON files.

    python3 bench/plot_serve.py --out serve.png DIR/serve-1.json DIR/serve-2.json ...

One panel per metric: mean, median and the highest percentile the runs report, in ms, against
the offered request rate (req/s; an `inf` run, all requests at once, sits at the right edge,
labelled). Uses Debian's python3-matplotlib (Agg backend, no display needed).
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="PNG to write")
    parser.add_argument("runs", nargs="+", help="serve-<rate>.json files")
    args = parser.parse_args()
    runs = []
    for path in args.runs:
        with open(path, encoding="utf-8") as f:
            runs.append(json.load(f))
    finite = [r["request_rate"] for r in runs if r["request_rate"] != "inf"]
    inf_x = (max(finite) * 1.5) if finite else 1.0
    points = sorted(
        ((inf_x if r["request_rate"] == "inf" else float(r["request_rate"])), r) for r in runs)
    xs = [x for x, _ in points]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric, title in ((axes[0], "ttft", "Time to first token"),
                              (axes[1], "tpot", "Time per output token (after the first)")):
        summary = [r[metric] for _, r in points]
        pkeys = sorted((k for k in summary[0] if k.startswith("p") and k.endswith("_ms")),
                       key=lambda k: float(k[1:-3]))
        ax.plot(xs, [s["mean_ms"] for s in summary], "o-", label="mean")
        ax.plot(xs, [s["median_ms"] for s in summary], "s--", label="median")
        if pkeys:
            top = pkeys[-1]
            ax.plot(xs, [s[top] for s in summary], "^:", label=top[:-3].upper())
        ax.set_xlabel("offered request rate (req/s)")
        ax.set_ylabel(f"{metric.upper()} (ms)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
        ticks = list(xs)
        ax.set_xticks(ticks)
        ax.set_xticklabels(["inf" if (r["request_rate"] == "inf") else f"{x:g}"
                            for x, (_, r) in zip(xs, points)])
    first = runs[0]
    fig.suptitle(f"scd-bench serve: targets {','.join(first['targets'])}, mode {first['mode']}, "
                 f"{first['requests']} requests per rate, max_tokens {first['output_len']}")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
