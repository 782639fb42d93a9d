// Package chaos holds the chaos tests: each runs the workload of
// testing/workload against a cluster while injecting faults (leader kills,
// leader-isolating and one-way partitions, leadership transfers with a
// skewed clock, snapshot installs to a lagging follower, SIGSTOP of real
// processes), heals, and runs every checker of testing/checker.
//
// They are skipped unless TASKSTORE_CHAOS=1 (and not -short):
//
//	make test-chaos              # every scenario once, with -race
//	make soak DURATION=1h        # the scenarios in a loop for an hour
//
// See docs/testing.md.
package chaos
