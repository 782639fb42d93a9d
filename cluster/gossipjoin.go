package cluster

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// gossipJoiner finds the other nodes: --join addresses, the map's gossip
// addresses, and the initial peers' gossip addresses asked over gRPC. It keeps
// rejoining map members gossip has lost (memberlist does not reconnect to
// nodes it declared dead after a partition heals).
type gossipJoiner struct {
	cfg        Config
	log        *slog.Logger
	stop       <-chan struct{}
	gossip     *gossip
	clusterMap func() *metapb.ClusterMap
	peerc      *peerClient
}

// run joins until stop closes.
func (j *gossipJoiner) run() {
	delay := 500 * time.Millisecond
	for sleepUntil(j.stop, delay) {
		known := j.gossip.snapshot()
		var addrs []string
		addrs = append(addrs, j.cfg.Join...)
		cm := j.clusterMap()
		for _, node := range cm.Nodes {
			if node.Id == j.cfg.ID || node.GossipAddress == "" || node.Membership == NodeRemoved {
				continue
			}
			if m, ok := known[node.Id]; !ok || m.Health == HealthDead {
				addrs = append(addrs, node.GossipAddress)
			}
		}
		if len(known) <= 1 {
			for _, p := range j.cfg.InitialCluster {
				if p.ID == j.cfg.ID {
					continue
				}
				if a := askGossipAddress(j.peerc, p); a != "" {
					addrs = append(addrs, a)
				}
			}
		}
		if len(addrs) == 0 {
			delay = 5 * time.Second
			continue
		}
		if joined, err := j.gossip.join(slices.Compact(addrs)); err != nil && joined == 0 {
			j.log.Debug("gossip join", "err", err)
			delay = time.Second
			continue
		}
		delay = 5 * time.Second
	}
}

// askGossipAddress asks initial peer p for its gossip address; "" if it
// does not answer as p.
func askGossipAddress(pc *peerClient, p Peer) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if r := pc.report(ctx, p.Address); r.GetNode() == p.ID {
		return r.GetGossipAddress()
	}
	return ""
}
