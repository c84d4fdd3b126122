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
file one the binary accepts (`BIN --help`); with TLS (deploy/k8s/components/tls), every
--tls-cert/--tls-key/--tls-ca a key of a mounted Secret, --tls-server-name among the certificate's
names, no grpc probe (the kubelet's speaks plaintext) and every httpGet probe over HTTPS (and
none over HTTPS without TLS), no client certificate required of probes, the ServiceMonitor
scraping over HTTPS with a CA that resolves. References resolve in the referrer's namespace.
Prints each problem; exit 1 if any.
"""
import argparse
import base64
import functools
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

    def named(self, kind, name, namespace=None):
        """The object of that kind and name in `namespace` (None: no namespace set)."""
        return next((o for o in self.kind(kind) if o["metadata"]["name"] == name and
                     o["metadata"].get("namespace") == namespace), None)

    def workloads(self):
        return self.kind("Deployment", "StatefulSet")

    def bad(self, where, what):
        self.problems.append(f"{where}: {what}")

    def services_labelled(self, selector):
        """The Services whose own labels a selector (a ServiceMonitor's) matches."""
        return [s for s in self.kind("Service") if matches(selector, s["metadata"].get("labels", {}))]

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
        if not r.named("Deployment", o["spec"]["scaleTargetRef"]["name"],
                       o["metadata"].get("namespace")):
            r.bad(f"ScaledObject {o['metadata']['name']}", "scales no Deployment of this overlay")
    for o in r.kind("ServiceMonitor"):
        sel = o["spec"]["selector"].get("matchLabels", {})
        services = r.services_labelled(sel)
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
        name, ns = w["metadata"]["name"], w["metadata"].get("namespace")
        pod = w["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        claims = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
        for v in volumes.values():
            if "configMap" in v and not r.named("ConfigMap", v["configMap"]["name"], ns):
                r.bad(name, f"volume {v['name']}: no ConfigMap {v['configMap']['name']}")
            if "secret" in v and not r.named("Secret", v["secret"]["secretName"], ns):
                r.bad(name, f"volume {v['name']}: no Secret {v['secret']['secretName']}")
            claim = v.get("persistentVolumeClaim")
            if claim and not r.named("PersistentVolumeClaim", claim["claimName"], ns):
                r.bad(name, f"volume {v['name']}: no claim {claim['claimName']}")
        for c in pod["containers"]:
            env = {e["name"]: e for e in c.get("env", [])}
            for e in env.values():
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    secret = r.named("Secret", ref["name"], ns)
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


def flag_value(cmd, flag):
    """The value of `--flag VALUE` or `--flag=VALUE` in a command; None when absent."""
    for i, arg in enumerate(cmd):
        if arg == flag and i + 1 < len(cmd):
            return cmd[i + 1]
        if arg.startswith(flag + "="):
            return arg[len(flag) + 1:]
    return None


def mounted_file(r, w, c, path):
    """The content (bytes) of the file at `path` in container c when a mounted ConfigMap or
    Secret holds it; None otherwise."""
    volumes = {v["name"]: v for v in w["spec"]["template"]["spec"].get("volumes", [])}
    ns = w["metadata"].get("namespace")
    for m in c.get("volumeMounts", []):
        mount = m["mountPath"].rstrip("/") + "/"
        if not path.startswith(mount):
            continue
        key, volume = path[len(mount):], volumes.get(m["name"], {})
        if "configMap" in volume:
            cm = r.named("ConfigMap", volume["configMap"]["name"], ns) or {}
            if key in cm.get("data", {}):
                return cm["data"][key].encode()
        if "secret" in volume:
            secret = r.named("Secret", volume["secret"]["secretName"], ns) or {}
            if key in secret.get("data", {}):
                return base64.b64decode(secret["data"][key])
            if key in secret.get("stringData", {}):
                return secret["stringData"][key].encode()
    return None


def daemon_config(r, w, c):
    """The TOML text of a daemon's --config, from the ConfigMap mounted where it points."""
    path = flag_value(c.get("command", []) + c.get("args", []), "--config")
    if path is None:
        return None
    text = mounted_file(r, w, c, path)
    if text is None:
        r.bad(w["metadata"]["name"], f"--config {path} is in no mounted ConfigMap")
        return None
    return text.decode()


@functools.lru_cache(maxsize=None)  # each pod of a pool mounts the same certificate
def certificate_names(pem):
    """The DNS names and IP addresses a PEM certificate is for; None when it is none."""
    done = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName"], input=pem,
                          capture_output=True)
    if done.returncode != 0:
        return None
    return frozenset(re.findall(r"(?:DNS:|IP Address:)([^,\s]+)", done.stdout.decode()))


def serves_tls(w):
    return any(flag_value(c.get("command", []) + c.get("args", []), "--tls-cert") is not None
               for c in w["spec"]["template"]["spec"]["containers"])


def node_certificate_names(r, w):
    """The names of the certificates a workload's daemons serve with (their --tls-cert)."""
    names = set()
    for c in w["spec"]["template"]["spec"]["containers"]:
        path = flag_value(c.get("command", []) + c.get("args", []), "--tls-cert")
        pem = mounted_file(r, w, c, path) if path else None
        names |= (certificate_names(pem) or set()) if pem else set()
    return names


def check_tls_container(r, w, c):
    name = w["metadata"]["name"]
    cmd = c.get("command", []) + c.get("args", [])
    files = {flag: flag_value(cmd, flag) for flag in ("--tls-cert", "--tls-key", "--tls-ca")}
    content = {}
    for flag, path in files.items():
        if path is not None:
            content[flag] = mounted_file(r, w, c, path)
            if content[flag] is None:
                r.bad(name, f"{flag} {path} is in no mounted Secret or ConfigMap")
    cert, server_name = content.get("--tls-cert"), flag_value(cmd, "--tls-server-name")
    if cert is not None:
        names = certificate_names(cert)
        if names is None:
            r.bad(name, f"--tls-cert {files['--tls-cert']}: not a PEM certificate")
        elif server_name is not None and server_name not in names:
            r.bad(name, f"--tls-server-name {server_name}: the certificate names "
                        f"{', '.join(sorted(names)) or 'nothing'} (nodes would refuse each other)")
    tls = files["--tls-cert"] is not None
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        spec = c.get(probe) or {}
        if tls and "grpc" in spec:
            r.bad(name, f"{probe}: grpc, but every listener serves TLS and the kubelet's grpc "
                        "probe speaks plaintext (httpGet /readyz with scheme HTTPS)")
        scheme = spec.get("httpGet", {}).get("scheme", "HTTP")
        if "httpGet" in spec and scheme != ("HTTPS" if tls else "HTTP"):
            r.bad(name, f"{probe}: httpGet over {scheme}, but the HTTP listener serves "
                        f"{'TLS' if tls else 'plain HTTP'}")
        if "httpGet" in spec and "--tls-require-client-cert" in cmd:
            r.bad(name, f"{probe}: the kubelet presents no client certificate, which "
                        "--tls-require-client-cert demands")


def check_tls(r):
    for w in r.workloads():
        for c in w["spec"]["template"]["spec"]["containers"]:
            if (c.get("command") or [""])[0] in DAEMONS:
                check_tls_container(r, w, c)
    for o in r.kind("ServiceMonitor"):
        ns = o["metadata"].get("namespace")
        sel = o["spec"]["selector"].get("matchLabels", {})
        services = r.services_labelled(sel)
        tls = any(serves_tls(w) for s in services for w in r.pods_matching(s["spec"]["selector"]))
        for ep in o["spec"]["endpoints"]:
            where = f"ServiceMonitor {o['metadata']['name']} port {ep['port']}"
            if ep.get("scheme", "http") != ("https" if tls else "http"):
                r.bad(where, f"scheme {ep.get('scheme', 'http')}, but the pods serve "
                             f"{'TLS' if tls else 'plain HTTP'}")
            server_name = ep.get("tlsConfig", {}).get("serverName")
            names = set().union(*(node_certificate_names(r, w) for s in services
                                  for w in r.pods_matching(s["spec"]["selector"])))
            if server_name and names and server_name not in names:
                r.bad(where, f"tlsConfig.serverName {server_name}: the nodes' certificates name "
                             f"{', '.join(sorted(names))}")
            ca = ep.get("tlsConfig", {}).get("ca", {}).get("secret")
            if tls and not ca:
                r.bad(where, "no tlsConfig.ca: Prometheus cannot check the nodes' certificate")
            if ca:
                secret = r.named("Secret", ca["name"], ns)
                if not secret or ca["key"] not in secret.get("data", {}):
                    r.bad(where, f"tlsConfig.ca: no Secret {ca['name']} with key {ca['key']}")


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
    check_tls(r)
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


SELF_TEST_TLS = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: t}
spec:
  selector: {matchLabels: {app: t}}
  template:
    metadata: {labels: {app: t}}
    spec:
      containers:
        - name: c
          command: ["scd-consumer", "--tls-cert", "/tls/tls.crt", "--tls-key", "/tls/gone.key",
                    "--tls-server-name", "scd-node", "--tls-require-client-cert"]
          env:
            - {name: SCD_CLUSTER_SECRET, valueFrom: {secretKeyRef: {name: elsewhere, key: k}}}
          ports: [{name: http, containerPort: 8002}]
          startupProbe: {grpc: {port: 8002}}
          readinessProbe: {httpGet: {path: /readyz, port: http}}
          volumeMounts: [{name: tls, mountPath: /tls}]
      volumes: [{name: tls, secret: {secretName: tls}}]
---
apiVersion: v1
kind: Secret
metadata: {name: tls}
data: {tls.crt: CERT}
---
apiVersion: v1
kind: Secret
metadata: {name: elsewhere, namespace: other}
data: {k: eA==}
---
apiVersion: v1
kind: Service
metadata: {name: t, labels: {scrape: "yes"}}
spec:
  selector: {app: t}
  ports: [{name: http, port: 8002, targetPort: http}]
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: m}
spec:
  selector: {matchLabels: {scrape: "yes"}}
  endpoints: [{port: http, tlsConfig: {serverName: scd-node}}]
"""


def self_test_certificate():
    """A self-signed certificate for the name `other` (base64 of its PEM)."""
    done = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-keyout", "/dev/null", "-subj", "/CN=other", "-days", "1",
         "-addext", "subjectAltName=DNS:other"], capture_output=True, check=True)
    return base64.b64encode(done.stdout).decode()


def self_test():
    problems = check(list(yaml.safe_load_all(SELF_TEST)))
    problems += check(list(yaml.safe_load_all(SELF_TEST_TLS.replace("CERT", self_test_certificate()))))
    want = ["does not match its own pod labels", "targetPort http", "port 50072 not exposed",
            "no Secret s", "$(POD_IP)", "no volume gone", "no SCD_CLUSTER_SECRET",
            "no Secret elsewhere", "/tls/gone.key is in no mounted",
            "--tls-server-name scd-node: the certificate names other", "startupProbe: grpc",
            "readinessProbe: httpGet over HTTP", "presents no client certificate",
            "scheme http, but the pods serve TLS", "no tlsConfig.ca",
            "tlsConfig.serverName scd-node: the nodes' certificates name other"]
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
