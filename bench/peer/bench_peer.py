#!/usr/bin/env python3
"""Ahead of llama.cpp on the same machine (`make bench-peer`, bench/README.md).

This project's runtime (build/bin/scd-engine-bench --commands, bench/engine_bench.h) and llama.cpp
(node-llama-cpp's prebuilt CPU binaries, bench/peer/peer_engine.mjs) on the same model (a
checkpoint, or seeded dummy weights; the GGUF `scd export-gguf` writes from the same numbers for
the peer), the same token ids and the same thread count, each resident in its own process for
the whole comparison of one model at one precision, their measurements alternating one by one
(odd rounds ours first): this VM's memory bandwidth drifts by tens of percent over minutes, and
alternating single measurements makes both engines meet the same machine. Each precision is set
against the peer's nearest one: f32 / F32, bf16 / BF16, int8 / Q8_0. Per cell: the median over the
rounds, the spread, and the ratio ours / peer (tokens/s; time to first token and memory: peer /
ours). The peer runs time to first token with flash attention (faster for it on every prompt
here) and decode with flash attention off and on, keeping its better median.

  bench_peer.py --build build --shared ../shared --out build/bench-peer [--rounds 5]
                [--decode-rounds 8] [--decode-steps 8] [--threads 2]
                [--models tinystories-4m,tinyllama-1.1b-4L,tinyllama-1.1b]
                [--served | --no-served] [--quick]

Writes OUT/raw.jsonl (every measurement), OUT/summary.json, OUT/table.md, OUT/peer.png and, with --served,
OUT/served.json: `scd-bench serve` against `scd serve --all-in-one` at 1..16 requests in flight
beside the peer's engine figures. Exit status 0 when it ran; the verdict (every judged cell >= 1.0,
or the cells below) is printed and in summary.json.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEER_VERSION = "3.21.1"
# (name, kind, path under shared/, layers, vocab, judged)
MODELS = [
    ("tinystories-4m", "model", "models/tinystories-4m", 0, 512, False),
    ("tinyllama-1.1b-4L", "dummy", "configs/tinyllama-1.1b.json", 4, 32000, True),
    ("tinyllama-1.1b", "dummy", "configs/tinyllama-1.1b.json", 0, 32000, True),
]
PRECISIONS = [("f32", "f32"), ("bf16", "bf16"), ("int8", "q8_0")]  # ours, the peer's GGUF type
JUDGED = [("decode", 1), ("decode", 8), ("decode", 16), ("ttft", 64), ("ttft", 1024)]


def log(*args):
    print("[bench-peer]", *args, file=sys.stderr, flush=True)


def ensure_peer():
    """npm ci of the pinned peer (integrity-checked lock file, no install scripts)."""
    pkg = os.path.join(HERE, "node_modules", "node-llama-cpp", "package.json")
    if os.path.exists(pkg) and json.load(open(pkg))["version"] == PEER_VERSION:
        return
    log("installing node-llama-cpp", PEER_VERSION, "(npm ci --ignore-scripts)")
    subprocess.run(["npm", "ci", "--ignore-scripts", "--omit=optional", "--no-audit", "--no-fund"],
                   cwd=HERE, check=True)


def export(build, shared, out, model, gguf_type):
    name, kind, path, layers, _, _ = model
    os.makedirs(os.path.join(out, "gguf"), exist_ok=True)
    file = os.path.join(out, "gguf", f"{name}-{gguf_type}.gguf")
    if os.path.exists(file):
        return file
    cmd = [os.path.join(build, "bin", "scd"), "export-gguf", "--type", gguf_type, "--out", file]
    cmd += ["--model" if kind == "model" else "--dummy-weights", os.path.join(shared, path)]
    if layers:
        cmd += ["--layers", str(layers)]
    log(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip())
    return file


class Engine:
    """One engine resident in its own process, answering measurement commands (EngineSession in
    bench/engine_bench.h; peer_engine.mjs)."""

    def __init__(self, name, cmd):
        self.name = name
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{name} did not start: {' '.join(cmd)}")

    def ask(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        if not answer:
            raise RuntimeError(f"{self.name} gave no answer to '{line}'")
        return answer

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=120)


def prompt_lengths(model, args):
    """The prompts asked for, those past the model's positions cut to what fits (tinystories-4m
    has 512: its long prompt is 448 tokens)."""
    limit = 448 if model[0] == "tinystories-4m" else 1 << 30
    return [min(int(v), limit) for v in args.prompt_lengths.split(",")]


def start_engines(build, shared, model, precision, gguf, args):
    name, kind, path, layers, vocab, _ = model
    cmd = [os.path.join(build, "bin", "scd-engine-bench"), "--dtype", precision,
           "--threads", str(args.threads), "--commands"]
    cmd += ["--model" if kind == "model" else "--dummy-weights", os.path.join(shared, path)]
    if layers:
        cmd += ["--layers", str(layers)]
    ours = Engine("scd", cmd)
    request = {"model": gguf, "threads": args.threads, "vocab": vocab, "decode_prompt": 64,
               "max_prompt": max(prompt_lengths(model, args))}
    peer = Engine("llama.cpp", ["node", os.path.join(HERE, "peer_engine.mjs"), json.dumps(request)])
    return ours, peer


def measure(build, shared, model, precision, gguf, args, raw):
    """Every cell of one model at one precision, the two engines' measurements alternating (odd
    rounds ours first). TTFT: the peer with flash attention (faster for it at every prompt here);
    decode: the peer with flash attention off and on, its better median kept."""
    ours, peer = start_engines(build, shared, model, precision, gguf, args)
    samples = []
    loaded = {e.name: int(e.ask("rss")) / 1e6 for e in (ours, peer)}  # weights and runtime

    def note(engine, kind, size, value, rnd, fa=None):
        row = {"model": model[0], "precision": precision, "engine": engine, "kind": kind,
               "size": size, "value": value, "round": rnd, "flash_attention": fa}
        samples.append(row)
        raw.write(json.dumps(row) + "\n")
        raw.flush()

    def ttft(engine, length):
        return 1e3 * float(engine.ask(f"ttft {length}" + (" 1" if engine is peer else "")))

    for length in prompt_lengths(model, args):
        ttft(ours, min(length, 16)), ttft(peer, min(length, 16))  # warm: pages, pools, threads
        rounds = args.rounds * (3 if length < 512 else 1)
        for r in range(rounds):
            for engine in ([ours, peer] if r % 2 == 0 else [peer, ours]):
                note(engine.name, "ttft", length, ttft(engine, length), r + 1,
                     True if engine is peer else None)
    steps = args.decode_steps
    for size in [int(v) for v in args.batch_sizes.split(",")]:
        ours.ask(f"batch {size}"), peer.ask(f"batch {size}")
        ours.ask("steps 2"), peer.ask("steps 2 0"), peer.ask("steps 2 1")  # warm
        for r in range(args.decode_rounds):
            runs = [(ours, "steps", None), (peer, "steps", False), (peer, "steps", True)]
            for engine, _, fa in (runs if r % 2 == 0 else runs[::-1]):
                line = f"steps {steps}" + ("" if fa is None else f" {int(fa)}")
                note(engine.name, "decode", size, size * steps / float(engine.ask(line)), r + 1,
                     fa)
    for engine in (ours, peer):
        note(engine.name, "rss_mb", 0, loaded[engine.name], 0)
        note(engine.name, "rss_end_mb", 0, int(engine.ask("rss")) / 1e6, 0)
    info = json.loads(peer.ask("info"))
    ours.close(), peer.close()
    return samples, info


def cpu_model():
    info = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            if ":" in line:
                k, v = (s.strip() for s in line.split(":", 1))
                info.setdefault(k, v)
    flags = set(info.get("flags", "").split())
    wanted = ["avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"]
    return {"model": info.get("model name", "?"), "cores": os.cpu_count(),
            "isa": [f for f in wanted if f in flags]}


def summarize(samples, models):
    """Medians over rounds per (model, precision, kind, size) and engine (the peer's decode: the
    better of its two flash-attention settings), ratios, the verdict."""
    groups = {}
    for x in samples:
        engine = x["engine"] if x["engine"] == "scd" or x["kind"] != "decode" else \
            f"llama.cpp fa={int(bool(x['flash_attention']))}"
        groups.setdefault((x["model"], x["precision"], x["kind"], x["size"]), {}).setdefault(
            engine, []).append(x["value"])
    cells, below = [], []
    judged_models = {m[0] for m in models if m[5]}
    def higher_better(kind):
        return kind == "decode"
    for (model, precision, kind, size), v in sorted(groups.items()):
        peers = {k: vals for k, vals in v.items() if k.startswith("llama.cpp")}
        if "scd" not in v or not peers:
            continue
        pick = max if higher_better(kind) else min
        peer_key = pick(peers, key=lambda k: statistics.median(peers[k]))
        ours, peer = statistics.median(v["scd"]), statistics.median(peers[peer_key])
        ratio = ours / peer if higher_better(kind) else peer / ours
        judged = model in judged_models and (kind, size) in JUDGED
        cell = {"model": model, "precision": precision, "kind": kind, "size": size,
                "ours": ours, "peer": peer, "ratio": ratio, "judged": judged,
                "peer_setting": peer_key, "rounds": min(len(v["scd"]), len(peers[peer_key])),
                "ours_range": [min(v["scd"]), max(v["scd"])],
                "peer_range": [min(peers[peer_key]), max(peers[peer_key])]}
        cells.append(cell)
        if judged and ratio < 1.0:
            below.append(cell)
    return cells, below


def fmt(v):
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def markdown(cells, below, meta):
    by = {(c["model"], c["precision"], c["kind"], c["size"]): c for c in cells}
    models = sorted({c["model"] for c in cells}, key=[m[0] for m in MODELS].index)
    sizes = {k: sorted({c["size"] for c in cells if c["kind"] == k}) for k in ("ttft", "decode")}
    head = (["model", "precision"] + [f"TTFT {s} ms" for s in sizes["ttft"]] +
            [f"decode B={s} tok/s" for s in sizes["decode"]] + ["RSS MB"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model in models:
        for ours, peer_type in PRECISIONS:
            row = [model, f"{ours} / {peer_type.upper()}"]
            for kind, size in ([("ttft", s) for s in sizes["ttft"]] +
                               [("decode", s) for s in sizes["decode"]] + [("rss_mb", 0)]):
                c = by.get((model, ours, kind, size))
                if c is None:
                    row.append("")
                    continue
                mark = "**" if c["judged"] else ""
                row.append(f"{fmt(c['ours'])} / {fmt(c['peer'])} = {mark}{c['ratio']:.2f}{mark}")
            lines.append("| " + " | ".join(row) + " |")
    verdict = ("every judged cell >= 1.0" if not below else "below 1.0: " + ", ".join(
        f"{c['model']} {c['precision']} {c['kind']} {c['size']} ({c['ratio']:.2f})" for c in below))
    return "\n".join([
        f"Machine: {meta['cpu']['model']}, {meta['cpu']['cores']} CPUs "
        f"({' '.join(meta['cpu']['isa'])}); {meta['threads']} threads each; "
        f"{meta['rounds']} rounds, medians; peer {meta['peer']}.",
        "Cells: ours / peer = ratio (tokens/s ours / peer; TTFT and RSS peer / ours); "
        "**bold**: judged.", "", *lines, "", f"Verdict: {verdict}.", ""])


def served_markdown(rows):
    if not rows:
        return ""
    lines = ["", "Served: `scd-bench serve` (local mode, 64 tokens in, requests at once = C) against "
             "`scd serve --all-in-one`, beside the engines' decode tokens/s at B = C:", "",
             "| model | precision | C | served tok/s | ours engine | llama.cpp engine | "
             "served / ours engine | TTFT p50 ms |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ours, peer = r.get("engine_ours"), r.get("engine_peer")
        lines.append(f"| {r['model']} | {r['precision']} | {r['concurrency']} | "
                     f"{fmt(r['output_tokens_per_s'])} | {fmt(ours) if ours else ''} | "
                     f"{fmt(peer) if peer else ''} | "
                     f"{r['output_tokens_per_s'] / ours:.2f} | {fmt(r['ttft_median_ms'])} |"
                     if ours else f"| {r['model']} | {r['precision']} | {r['concurrency']} | "
                     f"{fmt(r['output_tokens_per_s'])} | | | | {fmt(r['ttft_median_ms'])} |")
    return "\n".join(lines) + "\n"


def plot(cells, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = [m[0] for m in MODELS if any(c["model"] == m[0] for c in cells)]
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [c for c in cells if c["model"] == model and c["kind"] in ("ttft", "decode")]
        labels = sorted({(c["kind"], c["size"]) for c in mine}, key=lambda k: (k[0] != "ttft", k[1]))
        width = 0.8 / len(PRECISIONS)
        for i, (ours, peer_type) in enumerate(PRECISIONS):
            ratios = [next((c["ratio"] for c in mine if c["precision"] == ours and
                            (c["kind"], c["size"]) == k), 0) for k in labels]
            ax.bar([j + i * width for j in range(len(labels))], ratios, width,
                   label=f"{ours} vs {peer_type.upper()}")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([j + width for j in range(len(labels))])
        ax.set_xticklabels([("TTFT " if k == "ttft" else "B=") + str(s) for k, s in labels],
                           rotation=45, fontsize=8)
        ax.set_title(model, fontsize=10)
        ax.set_ylabel("ours / llama.cpp (higher: ours ahead)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "peer.png"), dpi=110)


def served(build, shared, out, models, args, peer_cells):
    """scd serve --all-in-one + scd-bench serve (local mode) at each concurrency."""
    results = []
    levels = [int(v) for v in args.batch_sizes.split(",")]
    for model in models:
        name, kind, path, layers, vocab, _ = model
        if layers == 0 and kind == "dummy":
            continue  # the 22-layer shape: engine cells only (minutes per level)
        for precision, _ in PRECISIONS:
            results += served_one(build, shared, out, model, precision, levels, args)
    for r in results:
        peer = next((c for c in peer_cells if c["model"] == r["model"] and c["kind"] == "decode"
                     and c["precision"] == r["precision"] and c["size"] == r["concurrency"]), None)
        if peer:
            r["engine_ours"], r["engine_peer"] = peer["ours"], peer["peer"]
    json.dump(results, open(os.path.join(out, "served.json"), "w"), indent=1)
    return results


def served_one(build, shared, out, model, precision, levels, args):
    name, kind, path, layers, vocab, _ = model
    work = os.path.join(out, "served", f"{name}-{precision}")
    os.makedirs(work, exist_ok=True)
    addr = os.path.join(work, "addr")
    if os.path.exists(addr):
        os.remove(addr)
    src = os.path.join(shared, path)
    cmd = [os.path.join(build, "bin", "scd"), "serve", "--all-in-one", "--listen", "127.0.0.1:0",
           "--address-file", addr, "--dtype", precision, "--threads", str(args.threads),
           "--consumer", f"c={src}"]
    cmd += ["--producer-model", src] if kind == "model" else ["--dummy-weights", src]
    if layers:
        cmd += ["--layers", str(layers)]
    server = subprocess.Popen(cmd, stderr=open(os.path.join(work, "serve.log"), "w"))
    results = []
    try:
        for _ in range(1200):
            if os.path.exists(addr) and open(addr).read().strip():
                break
            if server.poll() is not None:
                raise RuntimeError(f"scd serve exited: see {work}/serve.log")
            time.sleep(0.1)
        for c in levels:
            bench = [os.path.join(build, "bin", "scd-bench"), "serve", "--server",
                     open(addr).read().strip(), "--targets", "c", "--mode", "local",
                     "--input-len", "64", "--output-len", str(args.served_tokens),
                     "--vocab-size", str(vocab), "--num-prompts", str(max(2 * c, 4)),
                     "--max-concurrency", str(c), "--request-rate", "inf",
                     "--out", os.path.join(work, f"c{c}"), "--quiet"]
            subprocess.run(bench, check=True, capture_output=True, text=True)
            j = json.load(open(os.path.join(work, f"c{c}", "serve-inf.json")))
            results.append({"model": name, "precision": precision, "concurrency": c,
                            "output_tokens_per_s": j["output_throughput"],
                            "ttft_median_ms": j["ttft"]["median_ms"], "tpot_median_ms":
                            j["tpot"]["median_ms"]})
            log(f"served {name} {precision} C={c}: {j['output_throughput']:.1f} tok/s")
    finally:
        server.terminate()
        server.wait(timeout=60)
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--shared", default=os.environ.get("SCD_SHARED_DIR", "../shared"))
    p.add_argument("--out", default="build/bench-peer")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--models", default=",".join(m[0] for m in MODELS))
    p.add_argument("--decode-steps", type=int, default=8, help="decode steps per measurement")
    p.add_argument("--decode-rounds", type=int, default=8)
    p.add_argument("--prompt-lengths", default="64,1024")
    p.add_argument("--batch-sizes", default="1,2,4,8,16")
    p.add_argument("--served", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--served-tokens", type=int, default=32)
    p.add_argument("--quick", action="store_true", help="1 round, 4-layer shape, no served run")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.decode_rounds = 1, 2
        args.models, args.served = "tinystories-4m,tinyllama-1.1b-4L", False
    os.makedirs(args.out, exist_ok=True)
    ensure_peer()
    models = [m for m in MODELS if m[0] in args.models.split(",")]
    ggufs = {(m[0], ours): export(args.build, args.shared, args.out, m, t)
             for m in models for ours, t in PRECISIONS}
    samples, info = [], {}
    raw = open(os.path.join(args.out, "raw.jsonl"), "w")
    started = time.time()
    for model in models:
        for precision, _ in PRECISIONS:
            got, info = measure(args.build, args.shared, model, precision,
                                ggufs[(model[0], precision)], args, raw)
            samples += got
            log(f"{model[0]} {precision} ({time.time() - started:.0f} s)")
    cells, below = summarize(samples, models)
    meta = {"cpu": cpu_model(), "threads": args.threads, "rounds": args.rounds,
            "decode_rounds": args.decode_rounds, "decode_steps": args.decode_steps,
            "peer": f"{info.get('package', '')} ({info.get('system', '').strip()})",
            "seconds": time.time() - started}

    def write(served_rows):
        summary = {"meta": meta, "cells": cells, "below": below, "served": served_rows}
        json.dump(summary, open(os.path.join(args.out, "summary.json"), "w"), indent=1)
        table = markdown(cells, below, meta) + served_markdown(served_rows)
        open(os.path.join(args.out, "table.md"), "w").write(table)
        return table

    write([])  # the engines' figures are kept whatever the served run does
    plot(cells, args.out)
    served_rows = []
    if args.served:
        try:
            served_rows = served(args.build, args.shared, args.out, models, args, cells)
        except (RuntimeError, subprocess.SubprocessError, OSError, KeyError) as e:
            log(f"served run failed: {e}")
    print(write(served_rows))
    print(f"[bench-peer] {args.out}/table.md, peer.png, summary.json ({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
