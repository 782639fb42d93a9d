#!/usr/bin/env bash
# fuzz-short.sh FUZZTIME PKG... runs every Fuzz target of each package for
# FUZZTIME. It fails on a real finding: a failing input written, a panic, a
# failed check. Go 1.26's fuzz coordinator can also end a healthy run with a
# bare "context deadline exceeded" when a worker is mid-input as -fuzztime
# runs out (golang/go#75804, fixed in Go 1.27); such a run wrote no input,
# so this script replays the target's corpus (seeds and testdata) instead,
# and fails only if that replay fails.
set -u
fuzztime=$1; shift
GO=${GO:-go}
out=$(mktemp); trap 'rm -f "$out"' EXIT
for p in "$@"; do
	for t in $($GO test -list '^Fuzz' "$p" | grep '^Fuzz'); do
		echo "fuzz $p $t"
		if $GO test -run '^$' -fuzz "^$t\$" -fuzztime "$fuzztime" "$p" 2>&1 | tee "$out"; [ "${PIPESTATUS[0]}" -eq 0 ]; then
			continue
		fi
		if grep -q 'Failing input written to' "$out" || ! grep -q '^    context deadline exceeded$' "$out"; then
			exit 1
		fi
		echo "fuzz $p $t: stopped at the deadline with no failing input (golang/go#75804); replaying its corpus"
		$GO test -count=1 -run "^$t\$" "$p" || exit 1
	done
done
