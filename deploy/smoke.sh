#!/usr/bin/env bash
# Smoke test of the container deployment (deploy/docker-compose.yml).
#
# Builds taskstore:dev and taskstore-prometheus:dev, brings up 3 nodes, 2
# proxies and Prometheus under a private compose project and network, waits
# for every node's /readyz, inserts and claims a task with ./bin/taskctl
# through a proxy's published port, `docker kill`s a node, checks that a write
# still succeeds (through the other proxy too), checks /metrics and
# Prometheus' targets, runs every panel query of the Grafana dashboard
# (deploy/grafana/taskstore.json) against Prometheus under a workload and
# fails on one that errors or returns no series, and tears everything down
# (also on failure or Ctrl-C).
#
# Every step is bounded; the whole run takes a few minutes. All traffic goes to
# ports published on 127.0.0.1.
#
#   deploy/smoke.sh                    # or: make smoke
#   SMOKE_SKIP_BUILD=1 deploy/smoke.sh # reuse the images already built
#   SMOKE_KEEP=1 deploy/smoke.sh       # leave the cluster running (compose down yourself)
#
# Environment: SMOKE_PORT_BASE (default 27000: host ports BASE+101.. etc.),
# TASKSTORE_NET (first three octets of the private /24, default 10.213.72),
# SMOKE_PROJECT (compose project name), COMPOSE (compose command).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD

PROJECT=${SMOKE_PROJECT:-tssmoke$$}
BASE=${SMOKE_PORT_BASE:-27000}
export TASKSTORE_NET=${TASKSTORE_NET:-10.213.72}
export TASKSTORE_N1_GRPC_PORT=$((BASE + 101)) TASKSTORE_N2_GRPC_PORT=$((BASE + 102)) TASKSTORE_N3_GRPC_PORT=$((BASE + 103))
export TASKSTORE_N1_HTTP_PORT=$((BASE + 301)) TASKSTORE_N2_HTTP_PORT=$((BASE + 302)) TASKSTORE_N3_HTTP_PORT=$((BASE + 303))
export TASKSTORE_PROXY1_GRPC_PORT=$((BASE + 0)) TASKSTORE_PROXY1_HTTP_PORT=$((BASE + 300))
export TASKSTORE_PROXY2_GRPC_PORT=$((BASE + 10)) TASKSTORE_PROXY2_HTTP_PORT=$((BASE + 310))
export TASKSTORE_PROMETHEUS_PORT=$((BASE + 90))
# Fewer shards and relaxed Raft timeouts: the smoke test runs on small, busy machines.
export TASKSTORE_SHARDS=${TASKSTORE_SHARDS:-4}
export TASKSTORE_RAFT_TIMEOUT_SCALE=${TASKSTORE_RAFT_TIMEOUT_SCALE:-2}

if [[ -z "${COMPOSE:-}" ]]; then
	if docker compose version >/dev/null 2>&1; then COMPOSE="docker compose"; else COMPOSE=docker-compose; fi
fi
# shellcheck disable=SC2206
DC=($COMPOSE -p "$PROJECT" -f "$ROOT/deploy/docker-compose.yml")
TASKCTL=$ROOT/bin/taskctl
LOGDIR=${SMOKE_LOGDIR:-$(mktemp -d /tmp/taskstore-smoke.XXXXXX)}
START=$SECONDS

log() { printf '[smoke %4ds] %s\n' "$((SECONDS - START))" "$*"; }
fail() {
	log "FAIL: $*"
	exit 1
}

cleanup() {
	local rc=$?
	if [[ -n ${LOAD_PID:-} ]]; then kill "$LOAD_PID" 2>/dev/null || true; fi
	timeout 30 "${DC[@]}" ps >"$LOGDIR/ps.txt" 2>&1 || true
	timeout 60 "${DC[@]}" logs --no-color >"$LOGDIR/compose.log" 2>&1 || true
	if ((rc != 0)); then
		log "container logs in $LOGDIR/compose.log (last lines below)"
		tail -n 25 "$LOGDIR/compose.log" || true
	fi
	if [[ -n "${SMOKE_KEEP:-}" ]]; then
		log "SMOKE_KEEP set: leaving project $PROJECT up; stop it with: ${DC[*]} down -v"
	else
		log "tearing down project $PROJECT"
		timeout 120 "${DC[@]}" down -v --remove-orphans >"$LOGDIR/down.log" 2>&1 || log "compose down failed, see $LOGDIR/down.log"
	fi
	if ((rc == 0)); then log "PASS"; else log "exit $rc"; fi
	exit "$rc"
}

# wait_for SECONDS DESCRIPTION COMMAND...: retry COMMAND every second until it succeeds.
wait_for() {
	local limit=$1 what=$2
	shift 2
	local deadline=$((SECONDS + limit))
	until "$@" >/dev/null 2>&1; do
		((SECONDS < deadline)) || fail "timed out after ${limit}s waiting for $what"
		sleep 1
	done
	log "ok: $what"
}

ctl() { timeout 60 "$TASKCTL" --proxy "$@"; }

log "project $PROJECT, network $TASKSTORE_NET.0/24, host ports $BASE+, logs in $LOGDIR"

if [[ -z "${SMOKE_SKIP_BUILD:-}" ]]; then
	log "building images and bin/taskctl"
	# Generous limits: a cold build on a loaded 2-core machine takes minutes;
	# the limits only stop a hung build, they do not judge its speed.
	timeout 1800 make -s image >"$LOGDIR/image.log" 2>&1 || fail "make image (see $LOGDIR/image.log)"
	timeout 900 make -s prometheus-image >"$LOGDIR/prometheus-image.log" 2>&1 || fail "make prometheus-image (see $LOGDIR/prometheus-image.log)"
	timeout 1800 make -s build >"$LOGDIR/build.log" 2>&1 || fail "make build (see $LOGDIR/build.log)"
fi
[[ -x $TASKCTL ]] || fail "$TASKCTL missing: make build"
docker image inspect taskstore:dev >/dev/null || fail "image taskstore:dev missing"
log "image $(docker image inspect -f '{{.Id}} {{.Size}}B' taskstore:dev | cut -c8-19,72-)"

trap cleanup EXIT
trap 'exit 130' INT TERM

log "compose up"
timeout 300 "${DC[@]}" up -d >"$LOGDIR/up.log" 2>&1 || {
	cat "$LOGDIR/up.log"
	fail "compose up"
}

for i in 1 2 3; do
	port_var=TASKSTORE_N${i}_HTTP_PORT
	wait_for 120 "n$i /readyz on 127.0.0.1:${!port_var}" curl -fsS --max-time 2 "http://127.0.0.1:${!port_var}/readyz"
done
for i in 1 2; do
	port_var=TASKSTORE_PROXY${i}_HTTP_PORT
	wait_for 120 "proxy$i /readyz on 127.0.0.1:${!port_var}" curl -fsS --max-time 2 "http://127.0.0.1:${!port_var}/readyz"
done

P1=127.0.0.1:$TASKSTORE_PROXY1_GRPC_PORT
P2=127.0.0.1:$TASKSTORE_PROXY2_GRPC_PORT

log "cluster status through proxy1:"
ctl --endpoints "$P1" --timeout 30s status | sed 's/^/    /'

# Insert, claim, commit through proxy1.
ctl --endpoints "$P1" --timeout 30s -o json task insert smoke/work --value hello >"$LOGDIR/insert.json" || fail "insert"
id=$(jq -r '.tasks[0].id' "$LOGDIR/insert.json")
log "inserted task $id into smoke/work"
ctl --endpoints "$P1" --timeout 30s -o json task claim smoke/work --lease 30s --wait 5s >"$LOGDIR/claim.json" || fail "claim"
cid=$(jq -r '.tasks[0].id' "$LOGDIR/claim.json")
cver=$(jq -r '.tasks[0].version' "$LOGDIR/claim.json")
cval=$(jq -r '.tasks[0].value' "$LOGDIR/claim.json" | base64 -d)
[[ $cid == "$id" && $cval == hello ]] || fail "claimed $cid ($cval), want $id (hello)"
log "claimed task $cid version $cver value '$cval'"
ctl --endpoints "$P1" --timeout 30s task delete "$cid" --version "$cver" >/dev/null || fail "delete (commit) of the claimed version"
log "committed (deleted) $cid version $cver"

# Kill the node that leads the most shards (n1 if status is unreadable), so
# that elections must happen before the next write.
victim=n1
if ctl --endpoints "$P1" -o json status >"$LOGDIR/status.json" 2>/dev/null; then
	l=$(jq -r '[.shards[] | .leader] | group_by(.) | max_by(length) | .[0] // empty' "$LOGDIR/status.json" || true)
	[[ $l =~ ^n[123]$ ]] && victim=$l
fi
cid_victim=$(timeout 30 "${DC[@]}" ps -q "$victim")
[[ -n $cid_victim ]] || fail "no container for $victim"
log "docker kill $victim (leads the most shards)"
timeout 30 docker kill "$cid_victim" >/dev/null || fail "docker kill $victim"

# Writes must still succeed: the two survivors are a majority of every shard.
# One task into each of 8 groups, so that some land on shards the victim led
# and need an election first; taskctl retries Unavailable until --timeout.
t0=$SECONDS
for g in 0 1 2 3 4 5 6 7; do
	if ((g % 2)); then ep=$P2; else ep=$P1; fi
	t1=$SECONDS
	ctl --endpoints "$ep" --timeout 60s -o json task insert "smoke$g/after-kill" --value "survived-$g" >"$LOGDIR/insert-g$g.json" ||
		fail "insert into smoke$g/after-kill through $ep after killing $victim"
	log "ok: insert into smoke$g/after-kill through $ep ($((SECONDS - t1))s)"
done
log "ok: 8 writes after killing $victim in $((SECONDS - t0))s (elections included)"
for g in 0 1 2 3 4 5 6 7; do
	ctl --endpoints "$P2" --timeout 30s -o json task claim "smoke$g/after-kill" --wait 5s >"$LOGDIR/claim-g$g.json" || fail "claim smoke$g/after-kill"
	v=$(jq -r '.tasks[0].value' "$LOGDIR/claim-g$g.json" | base64 -d)
	[[ $v == "survived-$g" ]] || fail "claimed '$v' from smoke$g/after-kill, want survived-$g"
done
log "ok: claimed all 8 tasks written after the kill"

# The survivors notice the death and every shard gets a leader among them.
no_victim_leader() {
	ctl --endpoints "$P2" -o json status >"$LOGDIR/status2.json" &&
		jq -e --arg v "$victim" '([.shards[] | select(.leader == $v or .leader == "" or .leader == null)] | length == 0)
			and ([.nodes[] | select(.id == $v and .health == "alive")] | length == 0)' "$LOGDIR/status2.json"
}
wait_for 90 "every shard led by a survivor, $victim not alive" no_victim_leader
log "status after the kill:"
ctl --endpoints "$P2" --timeout 30s status | sed 's/^/    /'

# Metrics on the survivors and the proxies.
for i in 1 2 3; do
	[[ n$i == "$victim" ]] && continue
	port_var=TASKSTORE_N${i}_HTTP_PORT
	curl -fsS --max-time 5 "http://127.0.0.1:${!port_var}/metrics" >"$LOGDIR/metrics-n$i.txt" || fail "n$i /metrics"
	count=$(grep -c '^taskstore_' "$LOGDIR/metrics-n$i.txt" || true)
	log "n$i /metrics: $count taskstore_* samples, $(grep -c '^grpc_server_handled_total' "$LOGDIR/metrics-n$i.txt" || true) grpc_server_handled_total"
done
for i in 1 2; do
	port_var=TASKSTORE_PROXY${i}_HTTP_PORT
	curl -fsS --max-time 5 "http://127.0.0.1:${!port_var}/metrics" >"$LOGDIR/metrics-proxy$i.txt" || fail "proxy$i /metrics"
	log "proxy$i /metrics: $(grep -c '^taskstore_' "$LOGDIR/metrics-proxy$i.txt" || true) taskstore_* samples"
done

# Task counters are exported by the shard leader that applied the change, so
# their sum over the nodes is the workload: 8 inserts and 8 claims into groups
# smoke0..smoke7, all after the kill, so none was counted by the victim.
sum_metric() {
	cat "$LOGDIR"/metrics-n*.txt | awk -v m="$1" '$1 ~ "^"m"[{]group=\"smoke[0-7]\"[}]$" {s += $2} END {print s + 0}'
}
for m in taskstore_tasks_inserted_total taskstore_tasks_claimed_total; do
	got=$(sum_metric "$m")
	if [[ $got == 8 ]]; then log "ok: $m{group=~smoke[0-7]} summed over the nodes = 8"; else fail "$m{group=~smoke[0-7]} = $got over the nodes, want 8"; fi
done

# The proxies' own counters: every insert above went through one of them
# (1 before the kill, 8 after), each one Modify answered OK.
proxy_modify_ok=$(cat "$LOGDIR"/metrics-proxy*.txt | awk '$1 == "grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Modify\",grpc_service=\"taskstore.v1.TaskStore\",grpc_type=\"unary\"}" {s += $2} END {print s + 0}')
if ((proxy_modify_ok >= 9)); then log "ok: the proxies answered $proxy_modify_ok Modify calls OK (9 inserts, plus the commit)"; else fail "the proxies answered $proxy_modify_ok Modify calls OK, want at least 9"; fi

# Prometheus: ready, and its scrape targets (the killed node is expected down).
PROM=http://127.0.0.1:$TASKSTORE_PROMETHEUS_PORT
wait_for 60 "prometheus /-/ready" curl -fsS --max-time 2 "$PROM/-/ready"
wait_for 60 "prometheus scraped a node" sh -c "curl -fsS --max-time 2 '$PROM/api/v1/query?query=up' | jq -e '[.data.result[] | select(.metric.job==\"taskstore-node\" and .value[1]==\"1\")] | length > 0'"
targets_up() {
	curl -fsS --max-time 2 "$PROM/api/v1/targets" | jq -e --arg v "$victim:7301" \
		'[.data.activeTargets[] | select(.labels.instance != $v and .health != "up")] | length == 0'
}
wait_for 60 "prometheus: every target but $victim up" targets_up
curl -fsS --max-time 5 "$PROM/api/v1/targets" |
	jq -r '.data.activeTargets[] | "    \(.labels.job) \(.labels.instance) \(.health) \(.lastError)"' | sort
curl -fsS --max-time 5 "$PROM/api/v1/rules" | jq -r '"    rules loaded: \([.data.groups[].rules[]] | length)"'
curl -fsS --max-time 5 -o /dev/null "$PROM/graph" || fail "prometheus web UI /graph"
log "ok: prometheus web UI answers on /graph"

# The Grafana dashboard against live data: every panel's PromQL, with the
# dashboard's variables as Grafana sets them by default, must run without an
# error and return at least one series, while a workload runs through both
# proxies' HTTP/JSON API: inserts, claims, commits, refused duplicates (the
# error panels) and tasks left waiting (the backlog panels).
DASH=$ROOT/deploy/grafana/taskstore.json
H1=http://127.0.0.1:$TASKSTORE_PROXY1_HTTP_PORT
H2=http://127.0.0.1:$TASKSTORE_PROXY2_HTTP_PORT
dashboard_load() {
	local i=0 h
	while :; do
		i=$((i + 1))
		if ((i % 2)); then h=$H1; else h=$H2; fi
		for g in 0 1 2 3; do
			curl -sS --max-time 10 -o /dev/null -H 'Content-Type: application/json' "$h/v1/modify" \
				-d "{\"inserts\":[{\"queue\":\"dash$g/work\",\"value\":\"aGk=\"},{\"queue\":\"dash$g/backlog\",\"value\":\"aGk=\"}]}" || true
			curl -sS --max-time 10 -H 'Content-Type: application/json' "$h/v1/claim" \
				-d "{\"queues\":[\"dash$g/work\"],\"claimant\":\"smoke\",\"lease\":\"30s\"}" >"$LOGDIR/dash-claim.json" 2>/dev/null || true
			local tid tver
			tid=$(jq -r '.tasks[0].id // empty' "$LOGDIR/dash-claim.json" 2>/dev/null || true)
			tver=$(jq -r '.tasks[0].version // empty' "$LOGDIR/dash-claim.json" 2>/dev/null || true)
			if [[ -n $tid && -n $tver ]]; then
				curl -sS --max-time 10 -o /dev/null -H 'Content-Type: application/json' "$h/v1/modify" \
					-d "{\"claimant\":\"smoke\",\"deletes\":[{\"id\":\"$tid\",\"version\":\"$tver\"}]}" || true
			fi
		done
		# A duplicate id: refused (FailedPrecondition) by the node, counted by
		# the node's and the proxy's error panels and the refusals panel.
		curl -sS --max-time 10 -o /dev/null -H 'Content-Type: application/json' "$h/v1/modify" \
			-d '{"inserts":[{"queue":"dash0/dup","id":"dash-dup"}]}' || true
		sleep 0.5
	done
}
dashboard_load >"$LOGDIR/dashboard-load.log" 2>&1 &
LOAD_PID=$!
# The panels' variables as the dashboard's defaults set them; $__rate_interval
# is Grafana's 4 scrape intervals (15s in deploy/prometheus/prometheus.yml).
panel_query() {
	local e=$1
	e=${e//'$__rate_interval'/1m}
	e=${e//'$node_job'/taskstore-node}
	e=${e//'$proxy_job'/taskstore-proxy}
	e=${e//'$group'/.*}
	e=${e//'$queue'/.*}
	printf '%s' "$e"
}
jq -c '[.. | objects | select(has("targets")) | .title as $t | .targets[] | select(.expr) | {title: $t, ref: (.refId // ""), expr}] | .[]' "$DASH" >"$LOGDIR/panels.jsonl" ||
	fail "reading the panels of $DASH"
npanel=$(wc -l <"$LOGDIR/panels.jsonl")
((npanel >= 20)) || fail "only $npanel panel queries in $DASH"
# rate() over 1m needs two scrapes of the workload's counters: up to ~2
# minutes after the load starts; each query is retried until then.
deadline=$((SECONDS + 180))
nok=0
while IFS= read -r line; do
	title=$(jq -r .title <<<"$line")
	ref=$(jq -r .ref <<<"$line")
	q=$(panel_query "$(jq -r .expr <<<"$line")")
	[[ $q != *'$'* ]] || fail "panel '$title' ($ref): a variable the smoke test does not set: $q"
	while :; do
		ans=$(curl -sS --max-time 10 --get --data-urlencode "query=$q" "$PROM/api/v1/query" 2>&1 || true)
		st=$(jq -r '.status // "error"' <<<"$ans" 2>/dev/null || echo error)
		n=$(jq -r '.data.result | length' <<<"$ans" 2>/dev/null || echo 0)
		if [[ $st == success ]] && ((n > 0)); then break; fi
		if [[ $st == error ]] && jq -e '.errorType == "bad_data"' <<<"$ans" >/dev/null 2>&1; then
			fail "panel '$title' ($ref): the query is refused: $(jq -r .error <<<"$ans") -- $q"
		fi
		((SECONDS < deadline)) || fail "panel '$title' ($ref): no series (status $st) -- $q -- $ans"
		sleep 3
	done
	nok=$((nok + 1))
	log "ok: panel '$title' ($ref): $n series"
done <"$LOGDIR/panels.jsonl"
kill "$LOAD_PID" 2>/dev/null || true
wait "$LOAD_PID" 2>/dev/null || true
log "ok: all $nok panel queries of the dashboard return series under load"

log "all checks passed"
