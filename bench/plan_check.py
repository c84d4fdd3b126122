#!/usr/bin/env python3
"""`scd-bench plan` against a brute-force search of real emulated runs (issue 51).

For one small case -- the validation twin (one producer, consumer replicas, each daemon under its
own CPU quota) and one workload -- runs `scd-bench plan` over producers 0..1 and consumers
1..--max-consumers, then every candidate of that space for real: `scd-bench validate` with the
twin's consumer count set and every request asking the candidate's policy (a local candidate's
producer runs idle; its cost counts no producer). The real best is the cheapest candidate whose
real requests met the SLOs at the attainment, at equal cost the one with the most goodput per
node. The plan passes when it picked that deployment, or one that met for real at the same cost
within 5 % of its goodput per node (the acceptance's bound).

Writes OUT/check.json and OUT/check.md (each candidate: simulated and real attainment, goodput
per node), OUT/plan/ (the plan) and OUT/<policy>-<p>p-<c>c/ (each real run: validation.json, the
daemons' logs). Exit 0 when the plan passes, 1 when not, 2 on a run that failed.

  python3 bench/plan_check.py --twin bench/cluster/validation/emulated.toml \
      --workload W.toml --producer ../shared/models/tinystories-4m \
      --consumer ../shared/models/tinystories-4m-fables --artifact PAIR.scd --out DIR
"""
import argparse
import json
import os
import re
import subprocess
import sys


def run(argv):
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout)
        sys.exit(f"plan_check: {' '.join(argv[:2])} ended {done.returncode}")
    return done.stdout


def twin_text(path, consumers):
    """The twin with `consumers` replicas and its profiles' paths absolute."""
    text = open(path).read()
    base = os.path.dirname(os.path.abspath(path))
    text = re.sub(r'profile = "([^"/][^"]*)"',
                  lambda m: f'profile = "{os.path.join(base, m.group(1))}"', text)
    head, sep, pool = text.partition("[[consumer_pool]]")
    if not sep:
        sys.exit(f"plan_check: {path} has no [[consumer_pool]]")
    pool, n = re.subn(r"(?m)^count = \d+", f"count = {consumers}", pool, count=1)
    if n != 1:
        sys.exit(f"plan_check: {path}'s consumer pool has no count")
    return head + sep + pool


def with_mode(text, policy, name):
    """A workload's text with every [[mix]] asking `policy`."""
    text, n = re.subn(r'(?m)^mode = "[a-z]+"', f'mode = "{policy}"', text)
    if n == 0:
        sys.exit(f"plan_check: {name} has no [[mix]] mode")
    return text


def workload_text(path, policy):
    return with_mode(open(path).read(), policy, path)


def real_run(a, policy, consumers):
    name = f"{policy}-{0 if policy == 'local' else 1}p-{consumers}c"
    out = os.path.join(a.out, name)
    os.makedirs(out, exist_ok=True)
    twin, workload = os.path.join(out, "twin.toml"), os.path.join(out, f"{name}.toml")
    open(twin, "w").write(twin_text(a.twin, consumers))
    open(workload, "w").write(workload_text(a.workload, policy))
    print(f"plan_check: {name}: real run", file=sys.stderr, flush=True)
    run([os.path.join(a.bin, "scd-bench"), "validate", "--deployment", twin, "--workload",
         workload, "--producer", a.producer, "--consumer", a.consumer, "--artifact",
         a.artifact, "--out", out, "--seeds", "1", "--quiet"])
    v = json.load(open(os.path.join(out, "validation.json")))["workloads"][0]
    return name, v["real"], v["simulated"]


def better(x, y):
    """Whether candidate x is the better real deployment (both met)."""
    if x["cost"] != y["cost"]:
        return x["cost"] < y["cost"]
    return x["real_per_node"] > y["real_per_node"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for flag in ("--twin", "--workload", "--producer", "--consumer", "--artifact", "--out"):
        p.add_argument(flag, required=True)
    p.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", "build", "bin"))
    p.add_argument("--policies", default="local,scd,auto")
    p.add_argument("--max-consumers", type=int, default=2)
    p.add_argument("--attainment", type=float, default=0.9)
    p.add_argument("--seeds", type=int, default=3)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    run([os.path.join(a.bin, "scd-bench"), "plan", "--deployment", a.twin, "--workload",
         a.workload, "--out", os.path.join(a.out, "plan"), "--policies", a.policies,
         "--max-producers", "1", "--max-consumers", str(a.max_consumers), "--attainment",
         str(a.attainment), "--seeds", str(a.seeds), "--quiet"])
    plan = json.load(open(os.path.join(a.out, "plan", "plan.json")))["plan"]
    candidates = []
    for policy in a.policies.split(","):
        for consumers in range(1, a.max_consumers + 1):
            name, real, sim = real_run(a, policy, consumers)
            producers = 0 if policy == "local" else 1
            c = {"name": name, "policy": policy, "producers": producers,
                 "consumers": consumers, "cost": producers + consumers,
                 "real_attainment": real["good"] / max(real["requests"], 1),
                 "real_goodput": real["goodput"],
                 "simulated_attainment": sim["good"] / max(sim["requests"], 1),
                 "simulated_goodput": sim["goodput"]}
            c["real_per_node"] = c["real_goodput"] / c["cost"]
            c["real_meets"] = c["real_attainment"] >= a.attainment
            candidates.append(c)
    met = [c for c in candidates if c["real_meets"]]
    best = None
    for c in met:
        best = c if best is None or better(c, best) else best
    picked = None
    if plan:
        picked = next(c for c in candidates if c["policy"] == plan["policy"] and
                      c["producers"] == plan["producers"] and c["consumers"] == plan["consumers"])
    if best is None or picked is None:
        verdict = "passes" if best is None and picked is None else "fails"
    elif picked is best:
        verdict = "passes: the same deployment"
    elif (picked["real_meets"] and picked["cost"] == best["cost"] and
          picked["real_per_node"] >= 0.95 * best["real_per_node"]):
        verdict = "passes: within 5 % of the best's goodput per node"
    else:
        verdict = "fails"
    report = {"plan": plan, "real_best": best, "picked": picked, "verdict": verdict,
              "candidates": candidates, "attainment": a.attainment, "workload": a.workload}
    json.dump(report, open(os.path.join(a.out, "check.json"), "w"), indent=1)
    lines = [f"# plan against real runs: {a.workload}\n",
             f"Plan: {picked['name'] if picked else 'none'}; real best: "
             f"{best['name'] if best else 'none'}; {verdict}.\n",
             "| candidate | cost | attainment sim / real | goodput per node sim / real | "
             "meets (real) |", "|---|---|---|---|---|"]
    for c in candidates:
        lines.append(f"| {c['name']} | {c['cost']} | {c['simulated_attainment']:.3f} / "
                     f"{c['real_attainment']:.3f} | {c['simulated_goodput'] / c['cost']:.3f} / "
                     f"{c['real_per_node']:.3f} | {'yes' if c['real_meets'] else 'no'} |")
    open(os.path.join(a.out, "check.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if verdict.startswith("passes") else 1


if __name__ == "__main__":
    sys.exit(main())
