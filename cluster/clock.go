package cluster

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// clockGuard is what this node knows of its clock against its peers',
// and what it does about it.
// Log time is the leader's clock (Shard.Now), and it
// never goes back: a leader whose clock runs an hour ahead moves every
// shard it leads an hour on for good, expiring every lease. So, as
// CockroachDB does, each node measures its offset to every peer, and a node
// whose clock is more than Tuning.MaxClockOffset from most of its peers'
// refuses to lead: its proposals answer "not leader" (no hint), it hands its
// leaderships away, and it says why at ERROR until its clock is back. Peers
// that see it off do not hand it leadership either (leaderBalancer.preferred).
//
// A node that has measured nothing yet (just started, or no peer answers)
// is trusted: refusing then would stop a one-node cluster, and a node that
// reaches no peer cannot commit anything anyway.
type clockGuard struct {
	self string
	// now is the node's wall clock (Config.Clock).
	now func() time.Time
	// maxOffset is Tuning.MaxClockOffset; every is Tuning.ClockCheckEvery.
	maxOffset, every time.Duration
	log              *slog.Logger
	// offsetGauge is taskstore_clock_offset_seconds.
	offsetGauge prometheus.Gauge
	// members lists the cluster's nodes (the map's); ask asks the node at
	// an address for its clock (Unix nanoseconds).
	members func() []*metapb.Node
	ask     func(ctx context.Context, addr string) (int64, error)
	// local lists the replicas hosted here, whose leaderships a bad clock
	// hands away.
	local func() []*Shard

	mu      sync.Mutex
	offsets map[string]time.Duration // peer id -> this clock minus the peer's
	bad     bool
	median  time.Duration
}

// sample measures one peer: offset is this clock minus the peer's at the
// middle of the round trip, good to within half the round trip.
func (c *clockGuard) sample(ctx context.Context, addr string) (offset, uncertainty time.Duration, ok bool) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	start := time.Now()
	local := c.now()
	now, err := c.ask(cctx, addr)
	rtt := time.Since(start)
	if err != nil {
		return 0, 0, false
	}
	mid := local.Add(rtt / 2)
	return mid.Sub(time.Unix(0, now)), rtt / 2, true
}

// measure measures the offset to every member once and updates whether
// this node may lead (watch runs it).
func (c *clockGuard) measure(ctx context.Context) {
	type sample struct {
		id          string
		offset, unc time.Duration
		ok          bool
	}
	ch := make(chan sample)
	peers := 0
	for _, node := range c.members() {
		if node.Id == c.self || node.Membership == NodeRemoved || node.Address == "" {
			continue
		}
		peers++
		go func(id, addr string) {
			off, unc, ok := c.sample(ctx, addr)
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
		if d := abs(s.offset) - s.unc; d > c.maxOffset {
			far++
		}
	}
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
	c.offsetGauge.Set(c.median.Seconds())
	switch {
	case c.bad && !was:
		c.log.Error("this node's clock is too far from its peers': it refuses to lead until it is back (fix the clock: NTP, chrony)",
			"offset_median", c.median, "max_offset", c.maxOffset, "peers_too_far", far, "peers_measured", measured)
	case !c.bad && was:
		c.log.Info("this node's clock is back within the maximum offset of its peers'; it may lead again", "offset_median", c.median)
	}
}

// ClockBad reports whether this node's clock is too far from most of its
// peers' to lead.
func (n *Node) ClockBad() bool { return n.clock.isBad() }

func (c *clockGuard) isBad() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bad
}

// peerFar reports whether this node measured peer id's clock too far from
// its own.
func (c *clockGuard) peerFar(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	off, ok := c.offsets[id]
	return ok && abs(off) > c.maxOffset
}

// watch measures at once and then every ClockCheckEvery until stop
// closes; while the clock is bad it hands away every shard leadership it
// holds.
func (c *clockGuard) watch(stop <-chan struct{}) {
	if c.every <= 0 || c.maxOffset <= 0 {
		return
	}
	for first := true; first || sleepUntil(stop, c.every); first = false {
		ctx, cancel := context.WithTimeout(context.Background(), c.every)
		c.measure(ctx)
		cancel()
		if c.isBad() {
			handAwayLeaderships(c.local()) // best effort; the next round retries
		}
	}
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
