#!/usr/bin/python3
"""Cross-checks a rendered Kustomize overlay of deploy/k8s the way its users' failures call for
(issue 52): wiring that a schema cannot see and that fails only once pods run.

    k8s_check.py RENDERED.yaml [--bin DIR]   (RENDERED: `kubectl kustomize deploy/k8s/overlays/X`)
    k8s_check.py --self-test

Checks: every workload's selector against its own template labels; every Service, disruption
budget, network policy, ServiceMonitor and ScaledObject against the workloads or Services it must
match; every Service targetPort and probe port against the container's ports; every ConfigMap,
Secret (and key), claim and volume reference; $(VAR) in commands against the env; each daemon's
--config file present in its mounted ConfigMap, its listen ports equal to the container's, its
etcd endpoint a Service's port; with --bin, every flag in a command and every key of a config
file one the binary accepts (`BIN --help`). Prints each problem; exit 1 if any.
"""
import argparse
import re
import subprocess
import sys
import tomllib

import yaml

DAEMONS = ("scd-coordinator", "scd-producer", "scd-consumer")
LISTEN_KEYS = ("listen", "control-listen", "transfer-listen", "http-listen")


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


class Rendered:
    def __init__(self, docs):
        self.objs = [d for d in docs if d]
        self.problems = []

    def kind(self, *kinds):
        return [o for o in self.objs if o["kind"] in kinds]

    def named(self, kind, name):
        return next((o for o in self.kind(kind) if o["metadata"]["name"] == name), None)

    def workloads(self):
        return self.kind("Deployment", "StatefulSet")

    def bad(self, where, what):
        self.problems.append(f"{where}: {what}")

    def pods_matching(self, selector):
        return [w for w in self.workloads()
                if matches(selector, w["spec"]["template"]["metadata"].get("labels", {}))]


def container_ports(workload):
    ports = {}
    for c in workload["spec"]["template"]["spec"]["containers"]:
        for p in c.get("ports", []):
            ports[p["containerPort"]] = p.get("name")
    return ports


def check_selectors(r):
    for w in r.workloads():
        name = f"{w['kind']} {w['metadata']['name']}"
        sel = w["spec"]["selector"].get("matchLabels", {})
        if not matches(sel, w["spec"]["template"]["metadata"].get("labels", {})):
            r.bad(name, f"selector {sel} does not match its own pod labels")
    for kind in ("Service", "PodDisruptionBudget"):
        for o in r.kind(kind):
            sel = o["spec"]["selector"] if kind == "Service" else \
                o["spec"]["selector"].get("matchLabels", {})
            if not r.pods_matching(sel):
                r.bad(f"{kind} {o['metadata']['name']}", f"selector {sel} matches no pods")
    for o in r.kind("NetworkPolicy"):
        if not r.pods_matching(o["spec"]["podSelector"].get("matchLabels", {})):
            r.bad(f"NetworkPolicy {o['metadata']['name']}", "podSelector matches no pods")
    for o in r.kind("ScaledObject"):
        if not r.named("Deployment", o["spec"]["scaleTargetRef"]["name"]):
            r.bad(f"ScaledObject {o['metadata']['name']}", "scales no Deployment of this overlay")
    for o in r.kind("ServiceMonitor"):
        sel = o["spec"]["selector"].get("matchLabels", {})
        services = [s for s in r.kind("Service") if matches(sel, s["metadata"].get("labels", {}))]
        if not services:
            r.bad(f"ServiceMonitor {o['metadata']['name']}", "selects no Service")
        for ep in o["spec"]["endpoints"]:
            if not any(p.get("name") == ep["port"] for s in services for p in s["spec"]["ports"]):
                r.bad(f"ServiceMonitor {o['metadata']['name']}", f"no Service port `{ep['port']}`")


def check_ports(r):
    for s in r.kind("Service"):
        for w in r.pods_matching(s["spec"]["selector"]):
            ports = container_ports(w)
            for p in s["spec"]["ports"]:
                target = p.get("targetPort", p["port"])
                ok = target in ports.values() if isinstance(target, str) else target in ports
                if not ok:
                    r.bad(f"Service {s['metadata']['name']}",
                          f"targetPort {target} is no port of {w['metadata']['name']}")
    for w in r.workloads():
        ports = container_ports(w)
        for c in w["spec"]["template"]["spec"]["containers"]:
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                spec = c.get(probe)
                if not spec:
                    continue
                for how in ("grpc", "httpGet", "tcpSocket"):
                    if how in spec:
                        port = spec[how]["port"]
                        ok = port in ports.values() if isinstance(port, str) else port in ports
                        if not ok:
                            r.bad(f"{w['metadata']['name']} {probe}", f"port {port} not exposed")


def check_references(r):
    for w in r.workloads():
        name = w["metadata"]["name"]
        pod = w["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        claims = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
        for v in volumes.values():
            if "configMap" in v and not r.named("ConfigMap", v["configMap"]["name"]):
                r.bad(name, f"volume {v['name']}: no ConfigMap {v['configMap']['name']}")
            if "secret" in v and not r.named("Secret", v["secret"]["secretName"]):
                r.bad(name, f"volume {v['name']}: no Secret {v['secret']['secretName']}")
            claim = v.get("persistentVolumeClaim")
            if claim and not r.named("PersistentVolumeClaim", claim["claimName"]):
                r.bad(name, f"volume {v['name']}: no claim {claim['claimName']}")
        for c in pod["containers"]:
            env = {e["name"]: e for e in c.get("env", [])}
            for e in env.values():
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    secret = r.named("Secret", ref["name"])
                    if not secret:
                        r.bad(name, f"env {e['name']}: no Secret {ref['name']}")
                    elif ref["key"] not in {**secret.get("data", {}), **secret.get("stringData", {})}:
                        r.bad(name, f"env {e['name']}: Secret {ref['name']} has no key {ref['key']}")
            for arg in c.get("command", []) + c.get("args", []):
                for var in re.findall(r"\$\((\w+)\)", arg):
                    if var not in env:
                        r.bad(name, f"$({var}) in the command, not in the env")
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes and m["name"] not in claims:
                    r.bad(name, f"mount {m['mountPath']}: no volume {m['name']}")


def daemon_config(r, w, c):
    """The TOML text of a daemon's --config, from the ConfigMap mounted where it points."""
    cmd = c.get("command", []) + c.get("args", [])
    if "--config" not in cmd:
        return None
    path = cmd[cmd.index("--config") + 1]
    volumes = {v["name"]: v for v in w["spec"]["template"]["spec"].get("volumes", [])}
    for m in c.get("volumeMounts", []):
        mount = m["mountPath"].rstrip("/") + "/"
        ref = volumes.get(m["name"], {}).get("configMap")
        cm = r.named("ConfigMap", ref["name"]) if ref else None
        if path.startswith(mount) and cm and path[len(mount):] in cm.get("data", {}):
            return cm["data"][path[len(mount):]]
    r.bad(w["metadata"]["name"], f"--config {path} is in no mounted ConfigMap")
    return None


def accepted_flags(bin_dir, binary):
    """The flags `BIN --help` lists."""
    out = subprocess.run([f"{bin_dir}/{binary}", "--help"], capture_output=True, text=True)
    return set(re.findall(r"^\s+(--[a-z0-9-]+)", out.stdout + out.stderr, re.M))


def check_daemons(r, bin_dir):
    for w in r.workloads():
        name = w["metadata"]["name"]
        for c in w["spec"]["template"]["spec"]["containers"]:
            cmd = c.get("command", []) + c.get("args", [])
            if not cmd or cmd[0] not in DAEMONS:
                continue
            env = {e["name"] for e in c.get("env", [])}
            if "SCD_CLUSTER_SECRET" not in env:
                r.bad(name, "no SCD_CLUSTER_SECRET: the daemon refuses to start without it")
            text = daemon_config(r, w, c)
            config = tomllib.loads(text) if text is not None else {}
            ports = container_ports(w)
            for key in LISTEN_KEYS:
                if key in config:
                    port = int(str(config[key]).rsplit(":", 1)[1])
                    if port not in ports:
                        r.bad(name, f"{key} {config[key]}: port {port} is not a container port")
            registry = config.get("registry", "")
            m = re.match(r"etcd://([^:/]+):(\d+)$", registry)
            if registry and not m:
                r.bad(name, f"registry {registry}: not etcd://HOST:PORT")
            if m and not any(s["metadata"]["name"] == m[1] and
                             any(p["port"] == int(m[2]) for p in s["spec"]["ports"])
                             for s in r.kind("Service")):
                r.bad(name, f"registry {registry}: no Service {m[1]} with port {m[2]}")
            if bin_dir:
                flags = accepted_flags(bin_dir, cmd[0])
                for arg in cmd[1:]:
                    if arg.startswith("--") and arg not in flags:
                        r.bad(name, f"{cmd[0]} has no flag {arg}")
                for key in config:
                    if f"--{key}" not in flags:
                        r.bad(name, f"config key `{key}`: {cmd[0]} has no flag --{key}")


def check(docs, bin_dir=None):
    r = Rendered(docs)
    check_selectors(r)
    check_ports(r)
    check_references(r)
    check_daemons(r, bin_dir)
    return r.problems


SELF_TEST = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: d}
spec:
  selector: {matchLabels: {app: x}}
  template:
    metadata: {labels: {app: y}}
    spec:
      containers:
        - name: c
          command: ["scd-consumer", "--advertise", "$(POD_IP)"]
          ports: [{name: grpc, containerPort: 50071}]
          readinessProbe: {grpc: {port: 50072}}
          env: [{name: S, valueFrom: {secretKeyRef: {name: s, key: k}}}]
          volumeMounts: [{name: gone, mountPath: /x}]
---
apiVersion: v1
kind: Service
metadata: {name: svc}
spec:
  selector: {app: y}
  ports: [{name: http, port: 80, targetPort: http}]
"""


def self_test():
    problems = check(list(yaml.safe_load_all(SELF_TEST)))
    want = ["does not match its own pod labels", "targetPort http", "port 50072 not exposed",
            "no Secret s", "$(POD_IP)", "no volume gone", "no SCD_CLUSTER_SECRET"]
    missing = [w for w in want if not any(w in p for p in problems)]
    if missing:
        print("self-test: not found:", missing, "in", problems)
        return 1
    print(f"self-test: {len(problems)} problems found, as planted")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("rendered", nargs="?")
    p.add_argument("--bin", help="the daemons' directory (their --help lists the flags)")
    p.add_argument("--self-test", action="store_true")
    a = p.parse_args()
    if a.self_test:
        return self_test()
    with open(a.rendered) as f:
        problems = check(list(yaml.safe_load_all(f)), a.bin)
    for problem in problems:
        print(problem)
    print(f"{a.rendered}: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
