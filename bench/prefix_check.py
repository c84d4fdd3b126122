#!/usr/bin/env python3
"""The shared-prefix code cache's acceptance numbers (issue 17) from bench/prefix_cache.sh's runs.

    python3 bench/prefix_check.py OUT

Reads OUT/<scenario>/serve-inf.json (scd-bench serve --out) and prints, per acceptance point, the
measured values, the bar and whether it holds; exit status 1 when one does not hold.
"""
import json
import os
import statistics
import sys

PREFIX, TOTAL = 2048, 2080
# The producer prefills and sends the prompt less its last token (the consumer runs that one).
SENT = TOTAL - 1


def load(out, name):
    with open(os.path.join(out, name, "serve-inf.json")) as f:
        run = json.load(f)
    if run["failed"]:
        sys.exit(f"{name}: {run['failed']} failed streams: {run['failures_by_code']}")
    return run


def streams(run):
    s = run["per_stream"]
    return [dict(zip(s.keys(), row)) for row in zip(*s.values())]


def median_ttft(run):
    return statistics.median(x["ttft_ms"] for x in streams(run))


def node(run, role, index=0):
    return [n for n in run["nodes"] if n["role"] == role][index]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "build/bench-prefix"
    r = {n: load(out, n) for n in ("cold-local", "warm-local", "other-salt", "producer-warmup",
                                   "producer-hit", "consumer-warm", "fan-out")}
    ok = True

    def verdict(name, holds, text):
        nonlocal ok
        ok &= holds
        print(f"{name}: {text} -> {'holds' if holds else 'DOES NOT HOLD'}")

    cold_local, warm_local = median_ttft(r["cold-local"]), median_ttft(r["warm-local"])
    other = median_ttft(r["other-salt"])
    print(f"local TTFT: cold {cold_local:.0f} ms, warm {warm_local:.0f} ms "
          f"({streams(r['warm-local'])[0]['consumer_cached_tokens']} tokens from a's cache), "
          f"other salt {other:.0f} ms "
          f"({r['other-salt']['consumer_cached_tokens']} tokens from cache)")
    verdict("a different cache_salt never hits",
            r["other-salt"]["consumer_cached_tokens"] == 0 and other > 0.8 * cold_local,
            f"other salt: 0 cached tokens expected, got {r['other-salt']['consumer_cached_tokens']}; "
            f"TTFT {other:.0f} ms = {other / cold_local:.2f} x cold")

    hit = streams(r["producer-hit"])[0]
    ratio = hit["ttft_ms"] / cold_local
    verdict("producer hit, consumer cold: scd TTFT <= 0.2 x cold local",
            ratio <= 0.2 and hit["producer_cached_tokens"] >= PREFIX
            and hit["consumer_cached_tokens"] == 0,
            f"{hit['ttft_ms']:.0f} ms / {cold_local:.0f} ms = {ratio:.3f} "
            f"(producer cached {hit['producer_cached_tokens']}, consumer cached "
            f"{hit['consumer_cached_tokens']}, payload {hit['payload_bytes']} B; "
            f"warm-up's scd TTFT with both cold: {median_ttft(r['producer-warmup']):.0f} ms)")
    kept = node(r["producer-hit"], "producer").get("code_hit_tokens", 0)
    print(f"  producer hit: {kept} positions' codes sent as kept with the blocks (not encoded "
          f"again; the warm-up, same artifact and mode, kept them)")

    warm = streams(r["consumer-warm"])
    per_token = hit["payload_bytes"] / SENT
    suffix = (SENT - PREFIX) * per_token
    payloads = [s["payload_bytes"] for s in warm]
    cached = [s["consumer_cached_tokens"] for s in warm]
    # Codes are per token: the suffix's payload is its tokens' share of the cold request's.
    verdict("consumer warm: payload = the suffix's codes only",
            all(c == PREFIX for c in cached) and all(abs(p - suffix) <= 0.01 * suffix
                                                     for p in payloads),
            f"payloads {payloads} B against {SENT - PREFIX} tokens x {per_token:.1f} B/token = "
            f"{suffix:.0f} B (the cold request moved {hit['payload_bytes']} B); consumer cached "
            f"{cached}")
    warm_scd = median_ttft(r["consumer-warm"])
    verdict("consumer warm: scd TTFT <= 1.2 x warm local",
            warm_scd <= 1.2 * warm_local,
            f"{warm_scd:.0f} ms / {warm_local:.0f} ms = {warm_scd / warm_local:.3f}")

    fan = r["fan-out"]
    producer = node(fan, "producer")
    n = len(streams(fan)) // 3
    expect = PREFIX + n * (SENT - PREFIX)
    verdict("fan-out to a, b, c: producer prefill tokens = one prefix + the suffixes",
            producer["prefill_tokens"] == expect,
            f"{n} requests x 3 targets: the producer computed {producer['prefill_tokens']} tokens in "
            f"{producer['prefills']} prefills; one prefix + {n} suffixes of {SENT - PREFIX} = {expect} (three "
            f"prefixes would be >= {3 * PREFIX})")
    for x in ("warm-local", "producer-hit", "consumer-warm"):
        t = streams(r[x])[-1]["server_timings_ms"]
        print(f"  {x:16s} server timings (ms, last request): " +
              ", ".join(f"{k} {v:.0f}" for k, v in t.items()))
    for x in ("cold-local", "warm-local", "other-salt", "producer-warmup", "producer-hit",
              "consumer-warm", "fan-out"):
        print(f"  {x:16s} median TTFT {median_ttft(r[x]):8.0f} ms  payload "
              f"{r[x]['payload_bytes']:>10} B  cached producer/consumer "
              f"{r[x]['producer_cached_tokens']}/{r[x]['consumer_cached_tokens']}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
