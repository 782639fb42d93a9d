package cluster

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/raft"
)

// deadLeader shortens a follower's wait for an election when its leader's
// process is gone.
//
// A follower calls an election 1-2 heartbeat timeouts after it last heard
// from its leader, and a survivor that still believes in the dead leader
// refuses its vote (and pre-vote), so with two survivors writes stop until
// the later of the two times out: 1-2 s at the default 1 s. But a leader
// killed on a machine that stays up (kill -9, a crash, an OOM kill) closes
// its connections as it dies, and its port then refuses new ones: a
// follower learns within a millisecond what the timeout waits a second or
// two for. When a Raft connection of the group closes, the follower dials
// its leader's address; if the dial is refused, it lowers its heartbeat
// and election timeouts to the leader lease (the lowest raft accepts)
// until a new leader is known, so both survivors call the election 0.5-1 s
// after the leader's last heartbeat.
//
// Only a refused connection counts: a leader that is merely slow, paused or
// cut off by the network still accepts (or does not answer) a dial, and
// waits out the full timeout as before. Timeouts do not bear on Raft's
// safety, only on when an election starts.
type deadLeader struct {
	r      *raft.Raft
	tuning Tuning
	log    *slog.Logger
	shard  uint32
	// reloadMu serialises read-modify-writes of the group's reloadable
	// Raft configuration (here and in chores.boundLogs), so that neither writes
	// back a stale copy of the other's fields.
	reloadMu *sync.Mutex
	busy     atomic.Bool
	stopped  <-chan struct{}
}

// deadLeaderDial bounds the dial that tells a dead leader from a live one:
// a refusal comes back at once; anything slower is not a refusal.
const deadLeaderDial = 250 * time.Millisecond

// peerClosed is called when one of the group's accepted Raft connections
// ends; it checks the leader in the background, once at a time.
func (d *deadLeader) peerClosed() {
	if !d.busy.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer d.busy.Store(false)
		d.check()
	}()
}

func (d *deadLeader) check() {
	if d.r.State() != raft.Follower {
		return
	}
	addr, id := d.r.LeaderWithID()
	if addr == "" {
		return
	}
	// A process being killed closes its connections and its listener in
	// no set order: a dial in between still connects. Ask a few times.
	for i := 0; ; i++ {
		conn, err := net.DialTimeout("tcp", string(addr), deadLeaderDial)
		if errors.Is(err, syscall.ECONNREFUSED) {
			break
		}
		if err == nil {
			conn.Close()
		}
		if i == 3 {
			return
		}
		select {
		case <-d.stopped:
			return
		case <-time.After(25 * time.Millisecond):
		}
	}
	fast := max(d.tuning.LeaderLeaseTimeout, 10*time.Millisecond)
	if !d.setTimeouts(fast, fast, func(rc raft.ReloadableConfig) bool { return rc.HeartbeatTimeout > fast }) {
		return
	}
	d.log.Info("the shard's leader refuses connections: calling an election after the leader lease instead of the heartbeat timeout",
		"shard", d.shard, "leader", id, "leader_address", addr, "timeout", fast)
	// Back to the configured timeouts once another leader is known (or
	// this node leads), or after ten heartbeat timeouts at most.
	deadline := time.NewTimer(10 * d.tuning.HeartbeatTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case <-d.stopped:
			return
		case <-deadline.C:
			break wait
		case <-tick.C:
			if a, _ := d.r.LeaderWithID(); a != "" && a != addr {
				break wait
			}
		}
	}
	d.setTimeouts(d.tuning.HeartbeatTimeout, d.tuning.ElectionTimeout, func(rc raft.ReloadableConfig) bool { return rc.HeartbeatTimeout == fast })
}

// setTimeouts sets the group's heartbeat and election timeouts if cond
// holds for its current configuration; false if it did not (or raft
// refused the change).
func (d *deadLeader) setTimeouts(heartbeat, election time.Duration, cond func(raft.ReloadableConfig) bool) bool {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	rc := d.r.ReloadableConfig()
	if !cond(rc) {
		return false
	}
	rc.HeartbeatTimeout, rc.ElectionTimeout = heartbeat, election
	if err := d.r.ReloadConfig(rc); err != nil {
		d.log.Warn("set the Raft timeouts", "shard", d.shard, "heartbeat_timeout", heartbeat, "election_timeout", election, "err", err)
		return false
	}
	return true
}
