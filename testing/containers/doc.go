// Package containers runs the fault-injection scenarios of testing/chaos
// across real hosts: containers of the FROM scratch image built by
// `make image` (taskstore:dev, deploy/Dockerfile). Each scenario creates a
// private Docker network of its own (tsct-<pid>-<n>), starts N taskstored
// containers (n1..nN, --initial-cluster by container host name) and one
// taskproxy container, drives the workload of testing/workload through the
// proxy's port published on 127.0.0.1, cuts nodes off with
// `docker network disconnect` and kills them with `docker kill`, restores
// them, and runs every checker of testing/checker. Containers and network
// are removed at the end, also on failure.
//
// The test process talks to 127.0.0.1 only: the proxy's gRPC port for the
// workload, the final read and Admin.Status, and each node's published
// ports for /readyz and for the replica check (stale reads of each
// replica's tasks, see docs/testing.md).
//
// TestContainersFullDisk fills one node's data volume, and
// TestContainersMemoryBudget caps every node's memory (docker --memory) and
// inserts past it: refused in memory, held on disk, never OOM-killed.
//
// Skipped unless TASKSTORE_DOCKER=1; with it set, a missing docker or image
// is a failure:
//
//	make test-containers
package containers
