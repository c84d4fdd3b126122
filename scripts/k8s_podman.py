#!/usr/bin/env python3
"""Podman 4.3 as the kubelet and the controllers of one node, for a rendered Kustomize overlay
(`make k8s-test`, scripts/k8s_test.sh). `podman kube play` runs Pods with their containers, env,
ConfigMap volumes, host paths, claims, security contexts and memory limits; what a cluster adds
around the pods this script does, each the way Kubernetes does it:

  Deployment, StatefulSet   each replica a Pod from the template, named as the controllers name
                            them (<deployment>-<template hash>-<5 chars>, <statefulset>-<ordinal>);
                            a StatefulSet's volumeClaimTemplates a claim per pod (a podman
                            volume; fsGroup: group-owned and writable, as the kubelet makes it)
  ConfigMap                 a copy per pod (podman 4.3 rewrites a ConfigMap's volume in place at
                            every play: a pod starting while the next is played read it empty)
  Secret                    for env: into podman's secret store in the form `kube play` reads;
                            as a volume: its keys as files in a directory of the run, mounted
                            read-only, with the volume's defaultMode and the pod's fsGroup as the
                            kubelet writes them (podman 4.3's secret volumes crash kube play:
                            a nil pointer in VolumeFromSecret)
  Service                   its name a DNS alias (aardvark-dns) of every pod its selector picks
  Downward API              status.podIP: the pod's address, fixed with --ip, set as the value
  $(VAR) in command, args   expanded from the container's env (podman 4.3 leaves them as written)
  containerPort             published nowhere (podman 4.3 would bind it on the host)
  probes                    run here on the kubelet's schedule: startup, then readiness
                            (grpc: grpc.health.v1 Check; httpGet, over HTTPS without checking
                            the certificate as the kubelet does; tcpSocket; exec); liveness once
                            a pod is ready and again before it stops
  rollout                   maxSurge 1 / maxUnavailable 0: the new pod ready before the old one
                            stops; stopping runs preStop (podman exec), then SIGTERM, SIGKILL at
                            the end of terminationGracePeriodSeconds
Not run here -- the static check (make k8s-check) alone covers them: PodDisruptionBudget,
NetworkPolicy (no network plugin enforces it), topology spread, CPU requests, replica counts
other than the overlay's, restarts by failed liveness.

  k8s_podman.py up RENDERED.yaml --state S.json --network NET [--host-path FROM=TO ...]
  k8s_podman.py surge S.json WORKLOAD        a new pod of WORKLOAD, ready; prints its name
  k8s_podman.py retire S.json POD [--logs DIR]   preStop, SIGTERM, grace; prints how it ended
  k8s_podman.py address S.json WORKLOAD PORT_NAME    HOST:PORT of its newest pod
  k8s_podman.py liveness S.json              every pod's liveness probe, once
  k8s_podman.py down S.json [--logs DIR]     pods, claims, secrets, network; checks none is left
Exit 0 when it held; 1 with the reason (and the failing pod's logs) otherwise.
"""
import argparse
import base64
import concurrent.futures
import hashlib
import ipaddress
import json
import os
import random
import socket
import ssl
import subprocess
import sys
import time
import urllib.request

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import grpc_health_check  # noqa: E402  (tests/grpc_health_check.py: the grpc.health.v1 client)

SAFE = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet Kubernetes' generated names use


class Failure(Exception):
    pass


def podman(*args, check=True, input=None):
    done = subprocess.run(["podman", *args], capture_output=True, text=True, input=input)
    if check and done.returncode != 0:
        raise Failure(f"podman {' '.join(args[:3])}: {done.stderr.strip()[-600:]}")
    return done.stdout


def log(message):
    print(f"[k8s-podman] {time.strftime('%H:%M:%S')} {message}", flush=True)


# --- Objects to pods --------------------------------------------------------------------------


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def expand(word, values):
    """$(VAR) in a command or its args, as the kubelet expands them: a variable the container
    defines is replaced, $$ is a literal $, anything else stays as written."""
    out, i = "", 0
    while i < len(word):
        if word.startswith("$$", i):
            out, i = out + "$", i + 2
        elif word.startswith("$(", i) and ")" in word[i:]:
            end = word.index(")", i)
            name = word[i + 2:end]
            out += values.get(name, word[i:end + 1])
            i = end + 1
        else:
            out, i = out + word[i], i + 1
    return out


def template_hash(template):
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).digest()
    return "".join(SAFE[b % len(SAFE)] for b in digest[:10])


def pod_name(workload, ordinal):
    kind, name = workload["kind"], workload["metadata"]["name"]
    if kind == "StatefulSet":
        return f"{name}-{ordinal}"
    suffix = "".join(random.choice(SAFE) for _ in range(5))
    return f"{name}-{template_hash(workload['spec']['template'])}-{suffix}"


def pod_spec(state, workload, name, ip):
    """The Pod the controller makes, with what podman lacks filled in as the cluster would."""
    template = json.loads(json.dumps(workload["spec"]["template"]))
    spec = template["spec"]
    claims = []
    if workload["kind"] == "StatefulSet":
        spec.setdefault("hostname", name)
        spec.setdefault("subdomain", workload["spec"].get("serviceName"))
        for claim in workload["spec"].get("volumeClaimTemplates", []):
            claim_name = f"{claim['metadata']['name']}-{name}"
            spec.setdefault("volumes", []).append(
                {"name": claim["metadata"]["name"], "persistentVolumeClaim": {"claimName": claim_name}})
            claims.append(claim_name)
    for volume in spec.get("volumes", []):
        host = volume.get("hostPath")
        if host and host["path"] in state["host_paths"]:
            host["path"] = state["host_paths"][host["path"]]
    for container in spec["containers"]:
        for env in container.get("env", []):
            field = env.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            if field == "status.podIP":
                env.pop("valueFrom")
                env["value"] = ip
        values = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
        for key in ("command", "args"):
            if key in container:
                container[key] = [expand(word, values) for word in container[key]]
    played = json.loads(json.dumps(spec))
    for container in played["containers"]:
        # A containerPort without a hostPort publishes nothing in Kubernetes; podman 4.3 would
        # bind it on the host (so two pods with the same port would collide).
        ports = [p for p in container.pop("ports", []) if p.get("hostPort")]
        if ports:
            container["ports"] = ports
    metadata = {"name": name, "labels": dict(template["metadata"].get("labels", {}))}
    if workload["kind"] == "Deployment":
        metadata["labels"]["pod-template-hash"] = template_hash(workload["spec"]["template"])
    return claims, spec, {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": played}


def own_configmaps(state, pod):
    """The pod's ConfigMaps as copies of its own, its volumes pointed at them: podman 4.3 keeps a
    ConfigMap as a volume of its name and rewrites its files in place at every play, so a
    container reading one while the next pod is played could read it empty."""
    copies = []
    for volume in pod["spec"].get("volumes", []):
        if "configMap" not in volume:
            continue
        source = next(c for c in state["configmaps"]
                      if c["metadata"]["name"] == volume["configMap"]["name"])
        copy = json.loads(json.dumps(source))
        copy["metadata"]["name"] = f"{source['metadata']['name']}-{pod['metadata']['name']}"
        volume["configMap"]["name"] = copy["metadata"]["name"]
        copies.append(copy)
    return copies


def secret_volumes(state, pod):
    """The pod's Secret volumes as host directories of the run holding the Secret's keys as files,
    each with the volume's defaultMode (the kubelet's default 0644) and, with the pod's fsGroup,
    group-owned by it -- what the kubelet writes into the pod's tmpfs."""
    fs_group = pod["spec"].get("securityContext", {}).get("fsGroup")
    for volume in pod["spec"].get("volumes", []):
        source = volume.get("secret")
        if source is None:
            continue
        if source.get("items"):
            raise Failure(f"{pod['metadata']['name']}: Secret volume items are not emulated here")
        data = state["secret_data"].get(source["secretName"])
        if data is None:
            raise Failure(f"{pod['metadata']['name']}: no Secret {source['secretName']}")
        directory = os.path.join(state["dir"], f"{pod['metadata']['name']}-{volume['name']}")
        os.makedirs(directory)
        mode = source.get("defaultMode", 0o644)
        for key, value in data.items():
            path = os.path.join(directory, key)
            with open(path, "wb") as f:
                f.write(base64.b64decode(value))
            os.chmod(path, mode)
            if fs_group is not None:
                os.chown(path, -1, fs_group)
        if fs_group is not None:
            os.chown(directory, -1, fs_group)
        os.chmod(directory, 0o755 if fs_group is None else 0o750)
        volume.pop("secret")
        volume["hostPath"] = {"path": directory, "type": "Directory"}


def make_claim(name, fs_group):
    """A claim's volume; with the pod's fsGroup, group-owned and group-writable as the kubelet
    makes it (podman 4.3 ignores fsGroup)."""
    podman("volume", "create", name)
    if fs_group is not None:
        mountpoint = json.loads(podman("volume", "inspect", name))[0]["Mountpoint"]
        os.chown(mountpoint, -1, fs_group)
        os.chmod(mountpoint, 0o2775)


def next_ip(state):
    network = ipaddress.ip_network(state["subnet"])
    used = set(state["used_ips"])
    for host in list(network.hosts())[9:]:
        if str(host) not in used:
            state["used_ips"].append(str(host))
            return str(host)
    raise Failure(f"no free address in {network}")


def play(state, workload_name, ordinal=0):
    """Creates one pod of a workload with podman kube play; returns its record in the state."""
    workload = state["workloads"][workload_name]
    name = pod_name(workload, ordinal)
    ip = next_ip(state)
    claims, spec, pod = pod_spec(state, workload, name, ip)
    labels = pod["metadata"]["labels"]
    aliases = [s["metadata"]["name"] for s in state["services"]
               if selects(s["spec"].get("selector"), labels)]
    path = os.path.join(state["dir"], f"{name}.yaml")
    for claim in claims:
        make_claim(claim, pod["spec"].get("securityContext", {}).get("fsGroup"))
    configmaps = own_configmaps(state, pod)
    secret_volumes(state, pod)
    with open(path, "w") as f:
        yaml.safe_dump_all(configmaps + [pod], f)
    network = state["network"] + "".join(f":alias={a}" if i == 0 else f",alias={a}"
                                         for i, a in enumerate(aliases))
    podman("kube", "play", "--network", network, "--ip", ip, path)
    record = {"name": name, "workload": workload_name, "ip": ip, "aliases": aliases,
              "claims": claims, "spec": spec,
              "configmaps": [c["metadata"]["name"] for c in configmaps],
              "created": time.time()}
    state["pods"].append(record)
    log(f"{name}: played at {ip}" + (f", DNS {', '.join(aliases)}" if aliases else ""))
    return record


# --- Probes -----------------------------------------------------------------------------------


def port_number(container, port):
    if isinstance(port, int):
        return port
    for p in container.get("ports", []):
        if p.get("name") == port:
            return p["containerPort"]
    raise Failure(f"{container['name']}: no port named {port}")


def run_probe(pod, container, probe):
    """One try of a probe, as the kubelet makes it; True when it succeeds."""
    timeout = probe.get("timeoutSeconds", 1)
    if "grpc" in probe:
        address = f"{pod['ip']}:{probe['grpc']['port']}"
        return grpc_health_check.status(address, probe["grpc"].get("service", ""), timeout) == "SERVING"
    if "httpGet" in probe:
        get = probe["httpGet"]
        scheme = get.get("scheme", "HTTP").lower()
        url = f"{scheme}://{pod['ip']}:{port_number(container, get['port'])}{get.get('path', '/')}"
        unchecked = ssl.create_default_context()  # the kubelet checks no probe's certificate
        unchecked.check_hostname = False
        unchecked.verify_mode = ssl.CERT_NONE
        try:
            with urllib.request.urlopen(url, timeout=timeout,
                                        context=unchecked if scheme == "https" else None) as response:
                return 200 <= response.status < 400
        except OSError:
            return False
    if "tcpSocket" in probe:
        try:
            socket.create_connection((pod["ip"], port_number(container, probe["tcpSocket"]["port"])),
                                     timeout=timeout).close()
            return True
        except OSError:
            return False
    if "exec" in probe:
        done = subprocess.run(["podman", "exec", f"{pod['name']}-{container['name']}",
                               *probe["exec"]["command"]], capture_output=True, timeout=timeout + 5)
        return done.returncode == 0
    raise Failure(f"unknown probe {probe}")


def container_state(pod, container):
    out = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}}",
                 f"{pod['name']}-{container['name']}", check=False).split()
    return out if len(out) == 3 else ["missing", "-", "-"]


def wait_ready(pods):
    """Startup probes, then readiness, on each probe's own period; a pod is ready when every
    container's readiness probe succeeded after its startup probe did. Fails when a startup probe
    exhausts failureThreshold (the kubelet would restart the container) or a container exits."""
    phase = {}  # (pod name, container name) -> [stage, failures, next try]
    now = time.monotonic()
    for pod in pods:
        for c in pod["spec"]["containers"]:
            first = "startupProbe" if "startupProbe" in c else "readinessProbe"
            delay = c.get(first, {}).get("initialDelaySeconds", 0)
            phase[(pod["name"], c["name"])] = [first if first in c else "ready", 0, now + delay]
    while any(p[0] != "ready" for p in phase.values()):
        for pod in pods:
            for c in pod["spec"]["containers"]:
                entry = phase[(pod["name"], c["name"])]
                if entry[0] == "ready" or time.monotonic() < entry[2]:
                    continue
                status = container_state(pod, c)
                if status[0] not in ("running", "created", "configured"):
                    raise Failure(f"{pod['name']}/{c['name']} is {status[0]} (exit {status[1]}, "
                                  f"{status[2]} restarts):\n" + logs(pod, c))
                probe = c[entry[0]]
                if run_probe(pod, c, probe):
                    if entry[0] == "startupProbe" and "readinessProbe" in c:
                        log(f"{pod['name']}: startup probe passed after "
                            f"{time.time() - pod['created']:.1f} s")
                        entry[:] = ["readinessProbe", 0, time.monotonic()]
                    else:
                        entry[0] = "ready"
                        log(f"{pod['name']}/{c['name']}: ready after {time.time() - pod['created']:.1f} s")
                    continue
                entry[1] += 1
                if entry[0] == "startupProbe" and entry[1] >= probe.get("failureThreshold", 3):
                    raise Failure(f"{pod['name']}/{c['name']}: startup probe failed {entry[1]} times "
                                  f"({probe})\n" + logs(pod, c))
                entry[2] = time.monotonic() + probe.get("periodSeconds", 10)
        # paces: probe rounds; each probe itself waits for its own period
        time.sleep(0.2)


def logs(pod, container, tail=30):
    """A container's output (its stdout and stderr together), the last lines or all."""
    done = subprocess.run(["podman", "logs", *(["--tail", str(tail)] if tail else []),
                           f"{pod['name']}-{container['name']}"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return done.stdout


def liveness(state):
    for pod in (p for p in state["pods"] if not p.get("deleted")):
        for c in pod["spec"]["containers"]:
            probe = c.get("livenessProbe")
            if probe and not run_probe(pod, c, probe):
                raise Failure(f"{pod['name']}/{c['name']}: liveness probe failed\n" + logs(pod, c))
    log(f"liveness: {sum(not p.get('deleted') for p in state['pods'])} pods alive")


# --- Commands ---------------------------------------------------------------------------------


def load_state(path):
    with open(path) as f:
        return json.load(f)


def save_state(state):
    with open(state["path"], "w") as f:
        json.dump(state, f, indent=1)


def secret_data(secret):
    data = dict(secret.get("data", {}))
    for key, value in secret.get("stringData", {}).items():
        data[key] = base64.b64encode(value.encode()).decode()
    return json.dumps(data)


def up(args):
    objects = [o for o in yaml.safe_load_all(open(args.rendered)) if o]
    kinds = {"ConfigMap", "Secret", "Service", "Deployment", "StatefulSet"}
    state = {"path": args.state, "dir": os.path.dirname(os.path.abspath(args.state)),
             "network": args.network, "pods": [], "secrets": [], "used_ips": [],
             "host_paths": dict(hp.split("=", 1) for hp in args.host_path),
             "configmaps": [o for o in objects if o["kind"] == "ConfigMap"],
             "secret_data": {o["metadata"]["name"]: json.loads(secret_data(o))
                             for o in objects if o["kind"] == "Secret"},
             "services": [o for o in objects if o["kind"] == "Service"],
             "workloads": {o["metadata"]["name"]: o for o in objects
                           if o["kind"] in ("Deployment", "StatefulSet")},
             "static_only": sorted({o["kind"] for o in objects} - kinds)}
    for service in state["services"]:
        for port in service["spec"].get("ports", []):
            if port.get("targetPort") not in (None, port["port"], port.get("name")):
                log(f"Service {service['metadata']['name']}: port {port['port']} -> "
                    f"{port['targetPort']} not remapped here (a DNS alias keeps the pod's port)")
    podman("network", "create", args.network)
    state["subnet"] = json.loads(podman("network", "inspect", args.network))[0]["subnets"][0]["subnet"]
    save_state(state)
    for secret in (o for o in objects if o["kind"] == "Secret"):
        podman("secret", "create", secret["metadata"]["name"], "-", input=secret_data(secret))
        state["secrets"].append(secret["metadata"]["name"])
        save_state(state)
    log(f"network {args.network} ({state['subnet']}); secrets {', '.join(state['secrets'])}; "
        f"only the static check covers: {', '.join(state['static_only']) or 'nothing'}")
    for name, workload in state["workloads"].items():
        for ordinal in range(workload["spec"].get("replicas", 1)):
            play(state, name, ordinal)
            save_state(state)
    wait_ready(state["pods"])
    liveness(state)
    save_state(state)


def surge(args):
    state = load_state(args.state)
    pod = play(state, args.workload, len([p for p in state["pods"] if p["workload"] == args.workload]))
    save_state(state)
    wait_ready([pod])
    print(pod["name"])


def retire(args):
    """What the kubelet does to a pod being deleted: preStop, then SIGTERM; SIGKILL once the
    grace period (which the preStop hook counts against) runs out."""
    state = load_state(args.state)
    pod = next(p for p in state["pods"] if p["name"] == args.pod)
    grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
    start = time.monotonic()
    for c in pod["spec"]["containers"]:
        hook = c.get("lifecycle", {}).get("preStop", {}).get("exec")
        if hook:
            subprocess.run(["podman", "exec", f"{pod['name']}-{c['name']}", *hook["command"]],
                           capture_output=True, timeout=grace)
    # The containers, not the pod: the sandbox (podman's infra container, the network) stays up
    # until they have exited, as the kubelet keeps it -- `podman pod stop` would stop the infra
    # container beside them and take the network from a draining node. The stopped pod itself is
    # removed with the rest at `down`.
    left = max(1, int(grace - (time.monotonic() - start)))
    podman("stop", "--time", str(left), *[f"{pod['name']}-{c['name']}" for c in pod["spec"]["containers"]])
    took = time.monotonic() - start
    ends = [container_state(pod, c) for c in pod["spec"]["containers"]]
    if args.logs:
        for c in pod["spec"]["containers"]:
            with open(os.path.join(args.logs, f"{pod['name']}-{c['name']}.log"), "w") as f:
                f.write(logs(pod, c, tail=None))
    pod["deleted"] = True
    save_state(state)
    codes = ",".join(e[1] for e in ends)
    log(f"{pod['name']}: stopped {took:.1f} s after deletion (grace {grace} s), exit {codes}")
    if any(e[1] != "0" for e in ends):
        raise Failure(f"{pod['name']} did not exit 0 within its grace period (exit {codes})")


def address(args):
    state = load_state(args.state)
    pods = [p for p in state["pods"] if p["workload"] == args.workload and not p.get("deleted")]
    if not pods:
        raise Failure(f"no pod of {args.workload}")
    pod = max(pods, key=lambda p: p["created"])
    container = pod["spec"]["containers"][0]
    print(f"{pod['ip']}:{port_number(container, args.port)}")


def down(args):
    state = load_state(args.state)
    names = [pod["name"] for pod in state["pods"]]
    if args.logs:
        for pod in (p for p in state["pods"] if not p.get("deleted")):
            for c in pod["spec"]["containers"]:
                with open(os.path.join(args.logs, f"{pod['name']}-{c['name']}.log"), "w") as f:
                    f.write(logs(pod, c, tail=None))
    for _ in range(3):  # podman 4.3 may refuse a restarting container once ("state improper")
        names = [n for n in names if subprocess.run(["podman", "pod", "exists", n]).returncode == 0]
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(names) or 1) as pool:
            list(pool.map(lambda n: podman("pod", "rm", "-f", "-t", "5", n, check=False), names))
    for pod in state["pods"]:
        for volume in pod["claims"] + pod["configmaps"]:  # kube play keeps a ConfigMap as a volume
            podman("volume", "rm", "-f", volume, check=False)
    for secret in state["secrets"]:
        podman("secret", "rm", secret, check=False)
    podman("network", "rm", "-f", state["network"], check=False)
    left = [p["name"] for p in state["pods"]
            if subprocess.run(["podman", "pod", "exists", p["name"]]).returncode == 0]
    if left:
        raise Failure(f"pods left after down: {left}")
    log(f"down: {len(state['pods'])} pods, their claims, {len(state['secrets'])} secrets and the "
        f"network removed")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("up")
    p.add_argument("rendered")
    p.add_argument("--state", required=True)
    p.add_argument("--network", required=True)
    p.add_argument("--host-path", action="append", default=[])
    p.set_defaults(run=up)
    p = sub.add_parser("surge")
    p.add_argument("state")
    p.add_argument("workload")
    p.set_defaults(run=surge)
    p = sub.add_parser("retire")
    p.add_argument("state")
    p.add_argument("pod")
    p.add_argument("--logs", help="a directory for its containers' logs once they exited")
    p.set_defaults(run=retire)
    p = sub.add_parser("address")
    p.add_argument("state")
    p.add_argument("workload")
    p.add_argument("port")
    p.set_defaults(run=address)
    p = sub.add_parser("liveness")
    p.add_argument("state")
    p.set_defaults(run=lambda a: liveness(load_state(a.state)))
    p = sub.add_parser("down")
    p.add_argument("state")
    p.add_argument("--logs", help="a directory for every container's log first")
    p.set_defaults(run=down)
    args = parser.parse_args()
    try:
        args.run(args)
    except Failure as failure:
        print(f"[k8s-podman] FAILED: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
