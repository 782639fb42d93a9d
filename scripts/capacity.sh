#!/usr/bin/env bash
# capacity.sh: the capacity run (docs/performance.md). It loads TASKS tasks (64-byte
# values, 500 per request, over QUEUES queues, default 100,000, in QUEUE_GROUPS
# groups, default 1,000) into a
# `taskstored dev` cluster (three nodes on this machine, the state where
# STATE says), then reports:
#
#   - the load: seconds and tasks per second;
#   - per node: RSS after the load and after a restart, and bytes on disk
#     (the state engine, the node log, the shard directories);
#   - the restart: seconds from starting the stopped cluster to a write
#     accepted in each of 16 groups (every shard has a leader that applied
#     its log);
#   - claim-move on a fresh queue of 1,000 tasks beside the loaded ones,
#     against the same on a cluster holding nothing else, interleaved
#     ROUNDS times (each round restarts the loaded cluster: one more
#     restart time). Beside the loaded ones it is timed twice: at once
#     after the restart, while the engines still compact what the load
#     left them, and once they have settled (the three nodes together use
#     under a tenth of a core over 5 s; at most SETTLE seconds, default
#     600, and the wait is printed).
#
# Usage (from the repository, after make build):
#
#   make capacity                                 # TASKS=10000000: ~15 min on 2 cores
#   TASKS=100000000 DIR=/data/cap scripts/capacity.sh
#
# CHUNK (default TASKS) loads that many at a time and prints the time and
# the nodes' RSS and disk after each chunk; LOAD_UNTIL (a Unix time) stops
# loading before a chunk that would end after it (judged by the last one)
# and measures what was loaded (the 100M run is longer than some sessions).
# A chunk spreads over all QUEUES queues, and its requests carry at most
# CHUNK/QUEUES tasks (at most 500): keep CHUNK at 500 x QUEUES or more
# (20 million at the default 100,000 queues; 500,000 at QUEUES=1000).
#
# REMEASURE=1 keeps DIR and measures the cluster a run loaded there again,
# without loading (the tasks are counted from the nodes' metrics).
#
# PPROF=1 serves /debug/pprof on the nodes' http addresses (7301-7303), to
# profile a node while it loads.
#
# DIR (default /tmp/taskstore-capacity) holds both clusters and the logs;
# it is removed first. Needs ~300 bytes of disk per task per node with
# STATE=disk. The dev cluster uses ports 7000-7303.
set -euo pipefail

TASKS=${TASKS:-10000000}
DIR=${DIR:-/tmp/taskstore-capacity}
STATE=${STATE:-disk}
ROUNDS=${ROUNDS:-3}
CHUNK=${CHUNK:-$TASKS}
QUEUES=${QUEUES:-100000}
QUEUE_GROUPS=${QUEUE_GROUPS:-1000}
LOAD_UNTIL=${LOAD_UNTIL:-}
SETTLE=${SETTLE:-600}
REMEASURE=${REMEASURE:-}
BIN=$(cd "${TASKSTORE_BIN:-$(dirname "$0")/../bin}" && pwd)
EP=127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103
DEV=

log() { echo "capacity: $*" >&2; }
since() { awk -v now="$(date +%s.%N)" -v t0="$1" 'BEGIN { print now - t0 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { print (b > 0 ? a / b : 0) }'; }

stop_dev() {
	if [ -n "$DEV" ]; then
		kill -INT "$DEV" 2>/dev/null || true
		wait "$DEV" 2>/dev/null || true
		DEV=
	fi
}
trap stop_dev EXIT

# start_dev DATA: starts a dev cluster on DATA; STARTED is the seconds until
# a write was accepted in each of 16 groups.
start_dev() {
	local t0 g
	t0=$(date +%s.%N)
	"$BIN/taskstored" dev --data-dir "$1" --state "$STATE" ${PPROF:+--pprof} >>"$1.log" 2>&1 &
	DEV=$!
	for g in $(seq 0 15); do
		until "$BIN/taskctl" --endpoints "$EP" --timeout 5s task insert "probe-g$g/q" --value x >/dev/null 2>&1; do
			kill -0 "$DEV" 2>/dev/null || { log "the dev cluster exited; see $1.log"; exit 1; }
			sleep 0.2
		done
	done
	STARTED=$(since "$t0")
}

# nodes DATA WHAT: RSS (MB) and disk (MB) of each node.
nodes() {
	local n pid rss
	for n in n1 n2 n3; do
		pid=$(cat "$1/$n.pid")
		rss=$(awk '/VmRSS/ {printf "%.0f", $2/1024}' "/proc/$pid/status")
		printf '%s %s: RSS %s MB, disk %s MB (state %s, node log %s, shards %s)\n' "$2" "$n" "$rss" \
			"$(du -sm "$1/$n" | cut -f1)" "$(du -sm "$1/$n/state" 2>/dev/null | cut -f1)" \
			"$(du -sm "$1/$n/raftlog" 2>/dev/null | cut -f1)" "$(du -sm "$1/$n/shards" 2>/dev/null | cut -f1)"
	done
}

# settle DATA: waits until the nodes of DATA use under a tenth of a core
# together over 5 s, at most SETTLE seconds; SETTLED is the seconds waited.
settle() {
	local t0 a b n
	t0=$(date +%s)
	while :; do
		a=0 b=0
		for n in n1 n2 n3; do a=$((a + $(awk '{print $14 + $15}' "/proc/$(cat "$1/$n.pid")/stat"))); done
		sleep 5
		for n in n1 n2 n3; do b=$((b + $(awk '{print $14 + $15}' "/proc/$(cat "$1/$n.pid")/stat"))); done
		# Clock ticks are 1/100 s: a tenth of a core over 5 s is 50.
		if [ $((b - a)) -lt 50 ] || [ $(($(date +%s) - t0)) -ge "$SETTLE" ]; then
			break
		fi
	done
	SETTLED=$(($(date +%s) - t0))
}

# count: the tasks in the dev cluster (n1 replicates every shard).
count() {
	curl -s 127.0.0.1:7301/metrics | awk '/^taskstore_shard_tasks/ {s += $2} END {printf "%d", s}'
}

# claims: claim-move on a fresh queue of 1,000 tasks; prints tasks/s.
claims() {
	"$BIN/taskbench" --endpoints "$EP" --workload claim-move --prefill 1000 --clients 16 --queues 1 --groups 1 \
		--duration 10s -o json | awk -F': ' '/"tasks_per_sec"/ {gsub(",", "", $2); print $2}'
}

BIG=$DIR/loaded FRESH=$DIR/fresh
if [ -n "$REMEASURE" ]; then
	[ -d "$BIG" ] || { log "REMEASURE: no loaded cluster in $BIG"; exit 1; }
	rm -rf "$FRESH"
	start_dev "$BIG"
	TASKS=$(count)
	log "REMEASURE: $TASKS tasks in $BIG"
else
	rm -rf "$DIR"
	mkdir -p "$DIR"
	log "starting the cluster in $BIG (state: $STATE)"
	start_dev "$BIG"
	log "loading $TASKS tasks, $CHUNK at a time"
	t0=$(date +%s.%N)
	loaded=0
	while [ "$loaded" -lt "$TASKS" ]; do
		# The next chunk would end past LOAD_UNTIL if it took 1.2x the last.
		if [ -n "$LOAD_UNTIL" ] && [ "$(date +%s)" -ge "$((LOAD_UNTIL - ${last:-0} * 12 / 10))" ]; then
			log "the next chunk would end after LOAD_UNTIL: measuring at $loaded tasks"
			break
		fi
		n=$((TASKS - loaded < CHUNK ? TASKS - loaded : CHUNK))
		c0=$(date +%s.%N)
		"$BIN/taskbench" --endpoints "$EP" --workload insert-batch --batch 500 --clients 6 --queues "$QUEUES" --groups "$QUEUE_GROUPS" \
			--prefill "$n" --duration 1s -o json >>"$DIR/load.json"
		loaded=$((loaded + n))
		last=$(since "$c0" | cut -d. -f1)
		printf 'loaded %s tasks in %.0f s (this chunk %.0f tasks/s)\n' "$loaded" "$(since "$t0")" \
			"$(ratio "$n" "$(since "$c0")")"
		[ "$loaded" -lt "$TASKS" ] && nodes "$BIG" "at $loaded"
	done
	TASKS=$loaded
	secs=$(since "$t0")
	printf 'load: %s tasks in %.0f s (%.0f tasks/s)\n' "$TASKS" "$secs" "$(ratio "$TASKS" "$secs")"
	nodes "$BIG" "after the load"
fi

for r in $(seq "$ROUNDS"); do
	stop_dev
	start_dev "$BIG"
	printf 'round %s: restart of the loaded cluster to writes in 16 groups: %.1f s\n' "$r" "$STARTED"
	[ "$r" = 1 ] && nodes "$BIG" "after a restart"
	big=$(claims)
	settle "$BIG"
	settled=$(claims)
	stop_dev
	start_dev "$FRESH"
	fresh=$(claims)
	printf 'round %s: claim-move beside %s tasks %s tasks/s at once, %s after %s s of settling; alone %s tasks/s: %.2fx, settled %.2fx\n' \
		"$r" "$TASKS" "$big" "$settled" "$SETTLED" "$fresh" "$(ratio "$big" "$fresh")" "$(ratio "$settled" "$fresh")"
done
