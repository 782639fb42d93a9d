package cluster

import (
	"errors"
	"fmt"

	"github.com/e1158ecb/taskstore/cluster/control"
)

// Errors returned by the node. The rpc package maps them to gRPC codes in one
// place; wrap them with %w so errors.Is keeps working.
var (
	// ErrNotLeader: this node does not lead the shard; nothing was applied and
	// the request may be retried at the leader. Returned as *NotLeaderError.
	ErrNotLeader = errors.New("not the shard leader")
	// ErrUnknownOutcome: the command may or may not have committed (leadership
	// lost after proposing, or a timeout on our side). Retry with the same
	// request id: the state machine answers a duplicate with the first result.
	ErrUnknownOutcome = errors.New("outcome unknown")
	// ErrUnknownShard: the shard is not in the cluster map.
	ErrUnknownShard = errors.New("unknown shard")
	// ErrNotReady: the cluster map is not known yet (bootstrap under way).
	ErrNotReady = errors.New("cluster map not ready")
	// ErrShutdown: the node is stopping.
	ErrShutdown = errors.New("node is shutting down")
)

// NotLeaderError names the shard and, when known, its leader. A node that
// hosts no replica of the shard points at one that does instead: Replica
// is then set, and LeaderID and LeaderAddress name that replica.
type NotLeaderError struct {
	Shard         uint32
	LeaderID      string
	LeaderAddress string
	Replica       bool
	// Why says why this node does not serve the shard though it hosts a
	// replica (it diverged); empty means it is not the leader, or hosts
	// no replica when Replica is set.
	Why string
}

func (e *NotLeaderError) Error() string {
	if e.LeaderAddress == "" {
		if e.Why != "" {
			return fmt.Sprintf("shard %d: %s; no other replica is known yet", e.Shard, e.Why)
		}
		return fmt.Sprintf("shard %d: not the leader, leader unknown", e.Shard)
	}
	who := e.LeaderAddress
	if e.LeaderID != "" {
		who = e.LeaderID + " at " + e.LeaderAddress
	}
	if e.Replica {
		why := e.Why
		if why == "" {
			why = "no replica on this node"
		}
		return fmt.Sprintf("shard %d: %s; %s has one and knows the leader", e.Shard, why, who)
	}
	return fmt.Sprintf("shard %d: not the leader, leader is %s", e.Shard, who)
}

func (e *NotLeaderError) Unwrap() error { return ErrNotLeader }

// NotFoundError: a named node or shard does not exist (the control
// plane's, package control).
type NotFoundError = control.NotFoundError

// ErrInvalidRequest: a request that can never succeed as given.
var ErrInvalidRequest = control.ErrInvalidRequest

// ErrRefused: the request is valid but the cluster's state forbids it now
// (e.g. a removal that would leave too few replicas).
var ErrRefused = control.ErrRefused
