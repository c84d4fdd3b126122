#!/usr/bin/env python3
"""Goodput per node against link bandwidth and prefix share, per mode, at 100 nodes (issue 51).

    python3 bench/sim_sweep.py --out DIR [--bin build/bin] [--nodes 100]
        [--gbps 0.01,0.1,1,10] [--shares 0,0.5,0.8] [--splits 25,50] [--jobs 2]

For each prefix share and link speed, and each mode -- local (every node a consumer), raw, scd and
auto (P producers and the rest consumers, for each P of --splits: the better split is kept) --
`scd-bench simulate` finds the highest rate whose requests meet the SLOs at 0.9 attainment
(bisection on the rate, in log steps, to ~5 %); its goodput there over the nodes is the point.
The deployment is the example pair's profiles (bench/cluster/profiles/), one coordinator (not
counted), 64 MiB prefix caches; the traffic is the plan's shared-docs mix
(bench/cluster/plan/shared-docs.toml) for 20 s with its prefix share set. Writes DIR/sweep.json
and DIR/sim_sweep.png (a panel per prefix share; Debian's python3-matplotlib, Agg).
"""
import argparse
import concurrent.futures
import json
import math
import os
import re
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PROFILES = os.path.join(HERE, "cluster", "profiles")
MODES = ["local", "raw", "scd", "auto"]


def deployment(producers, consumers, gbps):
    text = ["[deployment]", 'name = "sweep"', "coordinators = 1"]
    if producers:
        text += ["[[producer_pool]]", 'name = "tinystories-4m"',
                 f'profile = "{PROFILES}/tinystories-4m.producer.toml"', f"count = {producers}",
                 "prefix_cache_mb = 64"]
    text += ["[[consumer_pool]]", 'name = "fables"',
             f'profile = "{PROFILES}/tinystories-4m-fables.consumer.toml"',
             f"count = {consumers}", "prefix_cache_mb = 64", "layers = 6"]
    if producers:
        text += ['producer = "tinystories-4m"', "code_bytes_per_token = 384", "code_kl = 0.0528",
                 "[[link]]", 'producer = "tinystories-4m"', 'consumer = "fables"',
                 f"gbps = {gbps}", "latency_us = 200"]
    return "\n".join(text) + "\n"


def workload(rate, share, mode):
    text = open(os.path.join(HERE, "cluster", "plan", "shared-docs.toml")).read()
    text = re.sub(r"(?m)^rate = .*$", f"rate = {rate}", text)
    text = re.sub(r"(?m)^duration_s = .*$", "duration_s = 20", text)
    text = re.sub(r"(?m)^share = .*$", f"share = {share}", text)
    text = re.sub(r'(?m)^mode = ".*"$', f'mode = "{mode}"', text)
    if share == 0:
        text = re.sub(r"(?m)^groups = .*$", "groups = 0", text)
    return text


def simulate(binary, work, name, dep, wl):
    d, w = os.path.join(work, name + ".deployment.toml"), os.path.join(work, name + ".workload.toml")
    open(d, "w").write(dep)
    open(w, "w").write(wl)
    out = subprocess.run([binary, "simulate", "--deployment", d, "--workload", w, "--drain", "30"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit(f"sim_sweep: {name}: {out.stderr}")
    return json.loads(out.stdout)


def capacity(binary, work, name, producers, consumers, gbps, share, mode):
    """The highest rate meeting the SLOs at 0.9, and its goodput (bisection in log rate)."""
    nodes = producers + consumers
    lo, hi = 0.25 * nodes, 16.0 * nodes
    best = 0.0
    for step in range(7):
        rate = math.sqrt(lo * hi)
        run = simulate(binary, work, f"{name}-{step}", deployment(producers, consumers, gbps),
                       workload(round(rate, 3), share, mode))
        if run["good"] >= 0.9 * max(run["requests"], 1):
            lo, best = rate, max(best, run["goodput"])
        else:
            hi = rate
    return best / nodes


def point(args, binary, work, share, gbps, mode):
    splits = [0] if mode == "local" else args.splits
    per_node = []
    for p in splits:
        c = args.nodes - p
        name = f"{mode}-s{share}-g{gbps}-p{p}"
        per_node.append((capacity(binary, work, name, p, c, gbps, share, mode), p))
    best, p = max(per_node)
    return {"share": share, "gbps": gbps, "mode": mode, "goodput_per_node": best,
            "producers": p, "splits": [{"producers": q, "goodput_per_node": g}
                                       for g, q in per_node]}


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("--out", required=True)
    a.add_argument("--bin", default=os.path.join(HERE, "..", "build", "bin"))
    a.add_argument("--nodes", type=int, default=100)
    a.add_argument("--gbps", default="0.01,0.1,1,10")
    a.add_argument("--shares", default="0,0.5,0.8")
    a.add_argument("--splits", default="25,50")
    a.add_argument("--jobs", type=int, default=2)
    args = a.parse_args()
    args.splits = [int(x) for x in args.splits.split(",")]
    gbps = [float(x) for x in args.gbps.split(",")]
    shares = [float(x) for x in args.shares.split(",")]
    work = os.path.join(args.out, "runs")
    os.makedirs(work, exist_ok=True)
    binary = os.path.join(args.bin, "scd-bench")
    jobs = []
    for share in shares:
        for mode in MODES:
            for g in ([gbps[0]] if mode == "local" else gbps):  # local uses no link
                jobs.append((share, g, mode))
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        points = list(pool.map(lambda j: point(args, binary, work, *j), jobs))
    for p in [p for p in points if p["mode"] == "local"]:
        for g in gbps[1:]:
            points.append(dict(p, gbps=g))
    json.dump({"nodes": args.nodes, "points": points}, open(os.path.join(args.out, "sweep.json"), "w"),
              indent=1)
    fig, axes = plt.subplots(1, len(shares), figsize=(4.2 * len(shares), 3.8), sharey=True)
    for ax, share in zip(axes if len(shares) > 1 else [axes], shares):
        for mode in MODES:
            xs = sorted(p["gbps"] for p in points if p["mode"] == mode and p["share"] == share)
            ys = [next(p["goodput_per_node"] for p in points
                       if p["mode"] == mode and p["share"] == share and p["gbps"] == x) for x in xs]
            ax.plot(xs, ys, marker="o", label=mode, linestyle="--" if mode == "local" else "-")
        ax.set_xscale("log")
        ax.set_xlabel("link (Gbit/s per producer)")
        ax.set_title(f"prefix share {share:g}")
        ax.grid(alpha=0.3)
    (axes[0] if len(shares) > 1 else axes).set_ylabel("goodput per node (requests/s)")
    (axes[0] if len(shares) > 1 else axes).legend()
    fig.suptitle(f"{args.nodes} nodes, the shared-docs mix, SLOs met by 0.9 of requests",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "sim_sweep.png"), dpi=90)
    print(json.dumps(points, indent=1))


if __name__ == "__main__":
    main()
