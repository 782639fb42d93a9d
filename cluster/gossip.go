package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Gossip health of a node, as memberlist sees it.
const (
	HealthAlive   = "alive"
	HealthSuspect = "suspect"
	HealthDead    = "dead"
	HealthLeft    = "left"
	HealthUnknown = "unknown"
)

// gossipMeta is what each node tells the others about itself. Gossip never
// changes Raft membership: it only carries addresses and health.
type gossipMeta struct {
	Address     string `json:"addr"`
	HTTPAddress string `json:"http,omitempty"`
	// DiskLow: the node's data disk is (nearly) full; peers do not hand it
	// leadership (disk.go).
	DiskLow bool `json:"disk_low,omitempty"`
}

// gossipMember is one node seen through gossip.
type gossipMember struct {
	ID            string
	GossipAddress string
	Meta          gossipMeta
	Health        string
}

type gossip struct {
	// Lock order: memberlist's internal locks before mu (the event delegate
	// runs under them).
	ml     *memberlist.Memberlist
	metaMu sync.Mutex // guards meta; independent of memberlist's locks
	meta   []byte
	log    *slog.Logger

	mu      sync.Mutex // guards members
	members map[string]gossipMember
	changed chan struct{} // signalled (non-blocking) on every membership event
}

// gossipConfig is what startGossip needs beyond the advertised metadata.
type gossipConfig struct {
	ID, BindAddr string
	// Keys encrypt gossip; the first is the primary (see Config.GossipKeys).
	Keys [][]byte
	// Label is sent outside every packet; memberlist drops packets whose
	// label differs, so clusters on one network never mix.
	Label string
}

func startGossip(gc gossipConfig, meta gossipMeta, log *slog.Logger) (*gossip, error) {
	id, bindAddr := gc.ID, gc.BindAddr
	host, portStr, err := net.SplitHostPort(bindAddr)
	if err != nil {
		return nil, fmt.Errorf("gossip address %q: %w", bindAddr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("gossip address %q: bad port", bindAddr)
	}
	// memberlist binds and advertises IP literals only: resolve a name.
	if host != "" && net.ParseIP(host) == nil {
		ips, err := net.LookupIP(host)
		if err != nil || len(ips) == 0 {
			return nil, fmt.Errorf("gossip address %q: cannot resolve %s: %v", bindAddr, host, err)
		}
		host = ips[0].String()
		for _, ip := range ips {
			if ip.To4() != nil {
				host = ip.String()
				break
			}
		}
	}
	encoded, err := json.Marshal(meta)
	if err != nil {
		return nil, err
	}
	g := &gossip{meta: encoded, log: log, members: make(map[string]gossipMember), changed: make(chan struct{}, 1)}
	conf := memberlist.DefaultLANConfig()
	conf.Name = id
	conf.BindAddr = host
	conf.BindPort = port
	conf.AdvertiseAddr = host
	conf.AdvertisePort = port
	conf.Delegate = g
	conf.Events = g
	conf.Logger = nil
	conf.LogOutput = &levelFilterWriter{log: log}
	conf.Label = gc.Label
	if len(gc.Keys) > 0 {
		kr, err := memberlist.NewKeyring(gc.Keys, gc.Keys[0])
		if err != nil {
			return nil, fmt.Errorf("gossip keys: %w", err)
		}
		conf.Keyring = kr
		// Refuse plain gossip and send none.
		conf.GossipVerifyIncoming = true
		conf.GossipVerifyOutgoing = true
	}
	ml, err := memberlist.Create(conf)
	if err != nil {
		return nil, fmt.Errorf("start gossip on %s: %w", bindAddr, err)
	}
	g.ml = ml
	return g, nil
}

// join contacts the given gossip addresses; it succeeds if any answers.
func (g *gossip) join(addrs []string) (int, error) {
	if len(addrs) == 0 {
		return 0, nil
	}
	return g.ml.Join(addrs)
}

// leave tells the others this node is going (bounded: memberlist's Leave
// waits for the broadcast) and stops gossiping. graceful=false just stops,
// as a crash would.
func (g *gossip) leave(graceful bool) {
	if graceful {
		if err := g.ml.Leave(2 * time.Second); err != nil {
			g.log.Warn("gossip leave", "err", err)
		}
	}
	g.ml.Shutdown()
}

// snapshot returns every node gossip has seen, with its health.
func (g *gossip) snapshot() map[string]gossipMember {
	// Members takes memberlist's node lock, and memberlist calls the event
	// delegate (which takes g.mu) under that lock: never hold g.mu here.
	suspect := map[string]bool{}
	for _, n := range g.ml.Members() {
		if n.State == memberlist.StateSuspect {
			suspect[n.Name] = true
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]gossipMember, len(g.members))
	for k, v := range g.members {
		if suspect[k] && v.Health == HealthAlive {
			v.Health = HealthSuspect
		}
		out[k] = v
	}
	return out
}

func (g *gossip) record(n *memberlist.Node, health string) {
	var meta gossipMeta
	_ = json.Unmarshal(n.Meta, &meta) // a node with bad metadata still counts for health
	g.mu.Lock()
	g.members[n.Name] = gossipMember{ID: n.Name, GossipAddress: n.Address(), Meta: meta, Health: health}
	g.mu.Unlock()
	select {
	case g.changed <- struct{}{}:
	default:
	}
}

// memberlist.Delegate
func (g *gossip) NodeMeta(limit int) []byte {
	g.metaMu.Lock()
	defer g.metaMu.Unlock()
	if len(g.meta) > limit {
		return nil
	}
	return g.meta
}

// setMeta changes what this node gossips about itself and tells the others.
func (g *gossip) setMeta(meta gossipMeta) error {
	encoded, err := json.Marshal(meta)
	if err != nil {
		return err
	}
	g.metaMu.Lock()
	g.meta = encoded
	g.metaMu.Unlock()
	return g.ml.UpdateNode(time.Second)
}
func (g *gossip) NotifyMsg([]byte)                           {}
func (g *gossip) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (g *gossip) LocalState(join bool) []byte                { return nil }
func (g *gossip) MergeRemoteState(buf []byte, join bool)     {}

// memberlist.EventDelegate
func (g *gossip) NotifyJoin(n *memberlist.Node)   { g.record(n, HealthAlive) }
func (g *gossip) NotifyUpdate(n *memberlist.Node) { g.record(n, HealthAlive) }
func (g *gossip) NotifyLeave(n *memberlist.Node) {
	health := HealthDead
	if n.State == memberlist.StateLeft {
		health = HealthLeft
	}
	g.record(n, health)
}

// levelFilterWriter turns memberlist's "[LEVEL] memberlist: ..." lines into
// slog records, dropping debug chatter.
type levelFilterWriter struct{ log *slog.Logger }

func (w *levelFilterWriter) Write(p []byte) (int, error) {
	line := memberlistMessage(string(bytes.TrimSpace(p)))
	switch {
	case bytes.Contains(p, []byte("[DEBUG]")), bytes.Contains(p, []byte("[TRACE]")):
	case bytes.Contains(p, []byte("use of closed network connection")):
		// A send racing this node's own shutdown: expected.
		w.log.Debug(line)
	case bytes.Contains(p, []byte("[ERR]")), bytes.Contains(p, []byte("[ERROR]")):
		w.log.Error(line)
	case bytes.Contains(p, []byte("[WARN]")):
		w.log.Warn(line)
	default:
		w.log.Info(line)
	}
	return len(p), nil
}

// memberlistMessage is the message of a memberlist log line
// ("2026/11/25 14:46:24 [WARN] memberlist: Refuting a suspect message"):
// the words after the level and the "memberlist: " prefix, without the
// standard logger's timestamp, which read as a second time in the line.
func memberlistMessage(line string) string {
	if i := strings.Index(line, "] "); i >= 0 && strings.Contains(line[:i], "[") {
		line = line[i+2:]
	}
	return strings.TrimPrefix(line, "memberlist: ")
}
