#!/usr/bin/env python3
"""Offline checks of deploy/ (no cluster, no registry): `make deploy-check`.

- every YAML file parses; Kubernetes manifests carry apiVersion, kind,
  metadata.name and the fields Taskstore relies on (stable ids, volumes,
  headless peer Service, probes, PodDisruptionBudget);
- docker-compose.yml has 3 nodes, 2 proxies and Prometheus, ports on 127.0.0.1;
- the Grafana dashboard is valid JSON, every panel has a query, and every
  metric it and the alert rules use is one Taskstore documents;
- the systemd unit has the settings docs/deploy.md promises.

Needs python3 with PyYAML (Debian: apt-get install python3-yaml).
"""
import json
import os
import re
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
errors = []


def check(cond, msg):
    if not cond:
        errors.append(msg)
    return cond


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


# Metric names the binaries export (docs/deploy.md, "Metrics").
KNOWN_METRICS = {
    "taskstore_tasks_inserted_total", "taskstore_tasks_claimed_total", "taskstore_tasks_committed_total",
    "taskstore_tasks_deleted_total", "taskstore_modify_refused_total", "taskstore_queue_tasks",
    "taskstore_queue_oldest_available_seconds", "taskstore_queue_paused", "taskstore_schedule_ticks_total", "taskstore_shard_leader", "taskstore_shard_term",
    "taskstore_shard_commit_index", "taskstore_shard_applied_index", "taskstore_shard_leader_changes_total",
    "taskstore_shard_apply_seconds", "taskstore_shard_snapshot_seconds", "taskstore_shard_proposed_requests_total", "taskstore_shard_proposed_entries_total", "taskstore_shard_log_bytes",
    "taskstore_shard_diverged", "taskstore_shard_replicas_disagree",
    "taskstore_shard_replicas_healthy", "taskstore_shard_replicas_placed",
    "taskstore_shard_slots", "taskstore_slot_moves", "taskstore_slot_moves_finished_total",
    "taskstore_log_syncs_total", "taskstore_log_bytes_written_total", "taskstore_log_append_entries",
    "taskstore_clock_offset_seconds", "taskstore_disk_free_bytes", "taskstore_disk_low",
    "taskstore_shard_memory_used_bytes", "taskstore_shard_memory_budget_bytes", "taskstore_memory_limit_bytes",
    "taskstore_build_info", "taskstore_proxy_requests_total", "taskstore_proxy_request_duration_seconds",
    "grpc_server_handled_total", "grpc_server_handling_seconds", "up",
}
METRIC_RE = re.compile(r"\b((?:taskstore|grpc_server)_[a-z_]+|up)\b(?=\s*[{\[)]|\s*$|\s*[-+*/=<>!])")


def metrics_in(expr):
    out = set()
    for m in METRIC_RE.findall(expr):
        for suffix in ("_bucket", "_sum", "_count"):
            if m.endswith(suffix) and m[: -len(suffix)] in KNOWN_METRICS:
                m = m[: -len(suffix)]
        out.add(m)
    return out


def check_metrics(where, expr):
    for m in metrics_in(expr):
        check(m in KNOWN_METRICS, f"{where}: unknown metric {m} in {expr!r}")


# ---- Kubernetes
kdir = os.path.join(HERE, "kubernetes")
docs = {}
for name in sorted(os.listdir(kdir)):
    if not name.endswith((".yaml", ".yml")) or name == "kustomization.yaml":
        continue
    for d in load_all(os.path.join(kdir, name)):
        for field in ("apiVersion", "kind", "metadata"):
            check(field in d, f"{name}: object without {field}")
        check(d.get("metadata", {}).get("name"), f"{name}: {d.get('kind')} without metadata.name")
        docs[(d["kind"], d["metadata"]["name"])] = d

kust = load_all(os.path.join(kdir, "kustomization.yaml"))[0]
for r in kust["resources"]:
    check(os.path.exists(os.path.join(kdir, r)), f"kustomization.yaml: missing resource {r}")

sts = docs.get(("StatefulSet", "taskstore"))
if check(sts, "kubernetes: StatefulSet taskstore missing"):
    spec = sts["spec"]
    check(spec.get("podManagementPolicy") == "Parallel", "StatefulSet: podManagementPolicy must be Parallel (bootstrap needs all nodes)")
    check(spec.get("volumeClaimTemplates"), "StatefulSet: volumeClaimTemplates missing")
    svc = docs.get(("Service", spec.get("serviceName")))
    if check(svc, f"StatefulSet: serviceName {spec.get('serviceName')} has no Service"):
        check(svc["spec"].get("clusterIP") == "None", "peer Service must be headless (clusterIP: None)")
        check(svc["spec"].get("publishNotReadyAddresses") is True, "peer Service needs publishNotReadyAddresses: true")
        check(svc["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items(), "peer Service selector does not match the pods")
    check(spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items(), "StatefulSet selector does not match its template")
    c = spec["template"]["spec"]["containers"][0]
    args = " ".join(c.get("args", []))
    check("--id=$(POD_NAME)" in args, "StatefulSet: --id must come from $(POD_NAME)")
    check("--gossip=$(POD_IP)" in args, "StatefulSet: --gossip must be the pod IP (memberlist advertises an IP literal)")
    ic = re.search(r"--initial-cluster=(\S+)", args)
    if check(ic, "StatefulSet: --initial-cluster missing"):
        peers = ic.group(1).split(",")
        check(len(peers) == spec["replicas"], "StatefulSet: --initial-cluster must list exactly `replicas` nodes")
        for i, p in enumerate(peers):
            check(p.startswith(f"{sts['metadata']['name']}-{i}={sts['metadata']['name']}-{i}.{spec['serviceName']}"),
                  f"StatefulSet: initial-cluster entry {p} is not the pod's stable DNS name")
    env = {e["name"] for e in c.get("env", [])}
    check({"POD_NAME", "POD_IP"} <= env, "StatefulSet: POD_NAME and POD_IP env missing")
    check(c.get("readinessProbe", {}).get("httpGet", {}).get("path") == "/readyz", "StatefulSet: readiness must be httpGet /readyz")
    check(c.get("livenessProbe", {}).get("httpGet", {}).get("path") == "/healthz", "StatefulSet: liveness must be httpGet /healthz")
    mounts = {m["name"] for m in c.get("volumeMounts", [])}
    check({t["metadata"]["name"] for t in spec["volumeClaimTemplates"]} <= mounts, "StatefulSet: claim template not mounted")

dep = docs.get(("Deployment", "taskstore-proxy"))
if check(dep, "kubernetes: Deployment taskstore-proxy missing"):
    c = dep["spec"]["template"]["spec"]["containers"][0]
    check("grpc" in c.get("readinessProbe", {}), "proxy: readiness must be a gRPC health probe")
    check(dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items(), "proxy selector mismatch")
    check(("Service", "taskstore-proxy") in docs, "proxy Service missing")
pdbs = [d for (k, _), d in docs.items() if k == "PodDisruptionBudget"]
check(any(p["spec"].get("maxUnavailable") == 1 and p["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/component") == "node" for p in pdbs),
      "PodDisruptionBudget with maxUnavailable 1 for the nodes missing")

# ---- compose
compose = load_all(os.path.join(HERE, "docker-compose.yml"))[0]
svcs = compose["services"]
check({"n1", "n2", "n3", "proxy1", "proxy2", "prometheus"} <= set(svcs), f"compose: services {sorted(svcs)}")
for name, s in svcs.items():
    for p in s.get("ports", []):
        check(str(p).startswith("127.0.0.1:"), f"compose: {name} publishes {p} beyond 127.0.0.1")
for n in ("n1", "n2", "n3"):
    cmd = svcs[n]["command"]
    g = cmd[cmd.index("--gossip") + 1]
    check(re.match(r"^(\$\{TASKSTORE_NET:-[\d.]+\}|[\d.]+)\.\d+:\d+$", g), f"compose: {n} --gossip {g} must be an IP")
    check(svcs[n]["networks"]["taskstore"]["ipv4_address"] in g, f"compose: {n} gossip IP differs from its ipv4_address")

# ---- Prometheus rules and scrape config
rules = load_all(os.path.join(HERE, "prometheus", "alerts.yml"))[0]
names = set()
for grp in rules["groups"]:
    for r in grp["rules"]:
        names.add(r.get("alert"))
        check(r.get("labels", {}).get("severity"), f"alert {r.get('alert')}: no severity")
        check(r.get("annotations", {}).get("summary"), f"alert {r.get('alert')}: no summary")
        check_metrics(f"alert {r.get('alert')}", r["expr"])
for must in ("TaskstoreShardNoLeader", "TaskstoreReplicationLag", "TaskstoreOldestTaskAge"):
    check(must in names, f"alerts.yml: {must} missing")
prom = load_all(os.path.join(HERE, "prometheus", "prometheus.yml"))[0]
jobs = {j["job_name"] for j in prom["scrape_configs"]}
check({"taskstore-node", "taskstore-proxy"} <= jobs, f"prometheus.yml: jobs {jobs}")

# ---- Grafana
with open(os.path.join(HERE, "grafana", "taskstore.json")) as f:
    dash = json.load(f)
check(dash.get("uid") and dash.get("title"), "dashboard: uid and title")
ids = set()
for p in dash["panels"]:
    check(p["id"] not in ids, f"dashboard: duplicate panel id {p['id']}")
    ids.add(p["id"])
    if p["type"] == "row":
        continue
    check(p.get("targets"), f"dashboard: panel {p['title']!r} has no query")
    for t in p.get("targets", []):
        check_metrics(f"dashboard panel {p['title']!r}", t["expr"])
titles = " ".join(p["title"].lower() for p in dash["panels"])
for word in ("throughput", "backlog", "oldest", "latency", "failures", "leader changes"):
    check(word in titles, f"dashboard: nothing about {word}")

# ---- systemd
with open(os.path.join(HERE, "systemd", "taskstored.service")) as f:
    unit = f.read()
for key in ("DynamicUser=yes", "StateDirectory=taskstore", "Restart=on-failure", "TimeoutStopSec=", "LimitNOFILE="):
    check(key in unit, f"taskstored.service: {key} missing")

if errors:
    for e in errors:
        print("deploy check:", e, file=sys.stderr)
    sys.exit(1)
print(f"deploy check: ok ({len(docs)} Kubernetes objects, {len(svcs)} compose services, "
      f"{sum(len(g['rules']) for g in rules['groups'])} alert rules, {len(dash['panels'])} dashboard panels)")
