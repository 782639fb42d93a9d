package cluster

import (
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// serialTransport is the transport every group's raft runs on: raft's
// NetworkTransport with its heartbeat fast path declined.
//
// hashicorp/raft registers a heartbeat handler that runs on the transport's
// connection goroutine, beside its main loop. A heartbeat carrying a newer
// term sets the node's term and state there, without synchronising with the
// leader loop: a leader parked in its select (or paused by GC, SIGSTOP or a
// frozen VM) that then takes a client's Apply stamps the entry with the new
// term, which it does not lead, at an index the real leader of that term
// fills with another entry. Followers see the same (index, term), keep their
// own entry and acknowledge, so the old leader commits and applies a
// different entry from everyone else and the replicas never converge
// (hashicorp/raft#695; the fix proposed upstream is #701). We saw exactly
// that (DESIGN.md, "Heartbeats on the main loop").
//
// With the handler declined, NetworkTransport hands heartbeats to raft's
// consumer channel like every other RPC, so a term change happens on the
// main loop, in order with the leader's own dispatch. What that costs is a
// heartbeat waiting behind a follower's disk write; the heartbeat timeout
// (1 s and up) is three orders of magnitude above an fdatasync.
type serialTransport struct {
	*raft.NetworkTransport
	stall time.Duration // pipelineStall when zero (pipeline.go)
	log   hclog.Logger  // where a closed pipeline is reported; nil: nowhere
	hold  *voteHold     // keeps a replica that lost its log from voting (vote.go); nil: none
}

// SetHeartbeatHandler declines the fast path: raft's main loop handles
// every AppendEntries.
func (serialTransport) SetHeartbeatHandler(func(raft.RPC)) {}
