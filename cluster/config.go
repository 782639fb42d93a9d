package cluster

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"unicode"
)

// DefaultShards is how many shards a cluster bootstraps with when
// Config.Shards is 0: one per initial node, so that each node leads one.
// Every Raft group costs each of its replicas a round per batch whatever
// the batch carries, so a 3-node cluster moves more tasks with 3 shards
// than with 8 (docs/performance.md); a cluster that grows adds shards
// online (taskctl shard add, then shard rebalance).
func DefaultShards(initialNodes int) int { return max(1, initialNodes) }

// MaxShards bounds Config.Shards: each shard is a Raft group with its own
// goroutines and heartbeats on every replica.
const MaxShards = 1024

// Validate reports what is wrong with a configuration, every problem at
// once; zero values that Start fills with defaults are fine. Start calls
// it, so a program that builds a Config gets the checks the taskstored
// flags have.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	name := func(what, s string) {
		if s == "" || strings.TrimSpace(s) != s || strings.IndexFunc(s, unicode.IsControl) >= 0 || len(s) > 256 {
			bad("%s %q: want a non-empty name of at most 256 bytes, without control characters or surrounding space", what, s)
		}
	}
	hostPort := func(what, addr string) {
		if addr == "" {
			return
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			bad("%s %q: not host:port: %v", what, addr, err)
		}
	}
	name("node id", c.ID)
	if c.DataDir == "" {
		bad("data directory: required")
	}
	hostPort("listen address", c.ListenAddr)
	hostPort("advertise address", c.AdvertiseAddr)
	hostPort("gossip address", c.GossipAddr)
	hostPort("HTTP address", c.HTTPAddr)
	seen := map[string]bool{}
	for _, p := range c.InitialCluster {
		name("initial cluster: node id", p.ID)
		if seen[p.ID] {
			bad("initial cluster: node %q named twice", p.ID)
		}
		seen[p.ID] = true
		if p.Address == "" {
			bad("initial cluster: node %q has no address", p.ID)
		}
		hostPort("initial cluster: address of "+p.ID, p.Address)
	}
	switch c.StateStore {
	case "", StateOnDisk, StateInMemory:
	default:
		bad("state store %q: want %q or %q", c.StateStore, StateOnDisk, StateInMemory)
	}
	if c.Shards < 0 || c.Shards > MaxShards {
		bad("shards %d: must be between 1 and %d (0: the default)", c.Shards, MaxShards)
	}
	if c.Replicas < 0 {
		bad("replicas %d: must be at least 1 (0: the default)", c.Replicas)
	}
	t := c.Tuning
	for what, d := range map[string]int64{"heartbeat timeout": int64(t.HeartbeatTimeout), "election timeout": int64(t.ElectionTimeout),
		"leader lease timeout": int64(t.LeaderLeaseTimeout), "commit timeout": int64(t.CommitTimeout), "apply timeout": int64(t.ApplyTimeout),
		"max clock offset": int64(t.MaxClockOffset), "min free disk": t.MinFreeDisk, "max log bytes": t.MaxLogBytes} {
		if d < 0 {
			bad("tuning: %s must not be negative", what)
		}
	}
	if t != (Tuning{}) && t.LeaderLeaseTimeout > t.HeartbeatTimeout {
		bad("tuning: leader lease timeout %v exceeds the heartbeat timeout %v (raft refuses it)", t.LeaderLeaseTimeout, t.HeartbeatTimeout)
	}
	if (c.TLS == nil) != (c.PeerTLS == nil) {
		bad("TLS and PeerTLS go together")
	}
	return errors.Join(errs...)
}
