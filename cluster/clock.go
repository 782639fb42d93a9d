package cluster

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// clockState is what this node knows of its clock against its peers'.
// Log time is the leader's clock (Shard.Now), and it
// never goes back: a leader whose clock runs an hour ahead moves every
// shard it leads an hour on for good, expiring every lease. So, as
// CockroachDB does, each node measures its offset to every peer, and a node
// whose clock is more than Tuning.MaxClockOffset from most of its peers'
// refuses to lead: its proposals answer "not leader" (no hint), it hands its
// leaderships away, and it says why at ERROR until its clock is back. Peers
// that see it off do not hand it leadership either (preferredLeader).
//
// A node that has measured nothing yet (just started, or no peer answers)
// is trusted: refusing then would stop a one-node cluster, and a node that
// reaches no peer cannot commit anything anyway.
type clockState struct {
	mu      sync.Mutex
	offsets map[string]time.Duration // peer id -> this clock minus the peer's
	bad     bool
	median  time.Duration
}

// clockSample measures one peer: offset is this clock minus the peer's at
// the middle of the round trip, good to within half the round trip.
func (n *Node) clockSample(ctx context.Context, addr string) (offset, uncertainty time.Duration, ok bool) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	start := time.Now()
	local := n.cfg.Clock()
	now, err := n.askClock(cctx, addr)
	rtt := time.Since(start)
	if err != nil {
		return 0, 0, false
	}
	mid := local.Add(rtt / 2)
	return mid.Sub(time.Unix(0, now)), rtt / 2, true
}

// MeasureClocks measures the offset to every member once and updates
// whether this node may lead (measureClocks runs it; tests call it).
func (n *Node) MeasureClocks(ctx context.Context) {
	cm := n.meta.Map()
	type sample struct {
		id          string
		offset, unc time.Duration
		ok          bool
	}
	ch := make(chan sample)
	peers := 0
	for _, node := range cm.GetNodes() {
		if node.Id == n.cfg.ID || node.Membership == NodeRemoved || node.Address == "" {
			continue
		}
		peers++
		go func(id, addr string) {
			off, unc, ok := n.clockSample(ctx, addr)
			ch <- sample{id, off, unc, ok}
		}(node.Id, node.Address)
	}
	offsets := map[string]time.Duration{}
	far, measured := 0, 0
	var all []time.Duration
	for range peers {
		s := <-ch
		if !s.ok {
			continue
		}
		measured++
		offsets[s.id] = s.offset
		all = append(all, s.offset)
		if d := abs(s.offset) - s.unc; d > n.cfg.Tuning.MaxClockOffset {
			far++
		}
	}
	c := &n.clock
	c.mu.Lock()
	defer c.mu.Unlock()
	if measured == 0 {
		return // nothing learned: keep what was known
	}
	slices.Sort(all)
	was := c.bad
	c.offsets = offsets
	c.median = all[len(all)/2]
	c.bad = far*2 > measured
	n.metrics.clockOffset.Set(c.median.Seconds())
	switch {
	case c.bad && !was:
		n.log.Error("this node's clock is too far from its peers': it refuses to lead until it is back (fix the clock: NTP, chrony)",
			"offset_median", c.median, "max_offset", n.cfg.Tuning.MaxClockOffset, "peers_too_far", far, "peers_measured", measured)
	case !c.bad && was:
		n.log.Info("this node's clock is back within the maximum offset of its peers'; it may lead again", "offset_median", c.median)
	}
}

// ClockBad reports whether this node's clock is too far from most of its
// peers' to lead.
func (n *Node) ClockBad() bool {
	n.clock.mu.Lock()
	defer n.clock.mu.Unlock()
	return n.clock.bad
}

// peerClockFar reports whether this node measured peer id's clock too far
// from its own.
func (n *Node) peerClockFar(id string) bool {
	n.clock.mu.Lock()
	defer n.clock.mu.Unlock()
	off, ok := n.clock.offsets[id]
	return ok && abs(off) > n.cfg.Tuning.MaxClockOffset
}

// measureClocks measures at once and then every ClockCheckEvery; while the
// clock is bad it hands away every shard leadership it holds.
func (n *Node) measureClocks() {
	every := n.cfg.Tuning.ClockCheckEvery
	if every <= 0 || n.cfg.Tuning.MaxClockOffset <= 0 {
		return
	}
	for first := true; first || n.sleep(every); first = false {
		ctx, cancel := context.WithTimeout(context.Background(), every)
		n.MeasureClocks(ctx)
		cancel()
		if !n.ClockBad() {
			continue
		}
		for _, s := range n.LocalShards() {
			if s.g.raft.State() == raft.Leader {
				s.g.raft.LeadershipTransfer() // best effort; the next round retries
			}
		}
	}
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
