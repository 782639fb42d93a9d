package cluster

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"testing"

	"github.com/hashicorp/memberlist"
)

func gossipMetaSeeds() [][]byte {
	return [][]byte{
		[]byte(`{"addr":"127.0.0.1:7001","http":"127.0.0.1:8001"}`),
		[]byte(`{"addr":"[::1]:7001"}`),
		[]byte(`{"addr":"node-1.example:7001","http":":8080"}`),
		[]byte(`{"addr":"no-port","http":"x:0"}`),
		[]byte(`{"addr":"a b:1","http":"h:99999"}`),
		[]byte(`{"addr":1}`),
		[]byte(`{"addr":"127.0.0.1:7001","extra":[1,2,{"x":null}]}`),
		[]byte(`null`),
		[]byte(`{`),
		{},
	}
}

// FuzzGossipMeta: a member's metadata, whatever it is, never panics the
// gossip delegates; decodeGossipMeta keeps only well-formed addresses, and
// the metadata a node sends about itself decodes to what it sent.
func FuzzGossipMeta(f *testing.F) {
	for _, s := range gossipMetaSeeds() {
		f.Add(s)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		m := decodeGossipMeta(data)
		for _, a := range []string{m.Address, m.HTTPAddress} {
			if a != "" && !validGossipAddr(a) {
				t.Fatalf("decoded address %q is not host:port", a)
			}
		}
		if len(data) <= memberlist.MetaMaxSize {
			var raw gossipMeta
			ok := func(a string) bool { return a == "" || validGossipAddr(a) }
			if json.Unmarshal(data, &raw) == nil && ok(raw.Address) && ok(raw.HTTPAddress) && m != raw {
				t.Fatalf("well-formed metadata %q decoded to %+v, want %+v", data, m, raw)
			}
		}
		// What a node advertises about itself (startGossip, NodeMeta)
		// decodes to what it advertised.
		if m.Address != "" {
			self, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			if again := decodeGossipMeta(self); again != m {
				t.Fatalf("round trip of %+v: %+v", m, again)
			}
		}

		// The delegates memberlist calls with what other members sent.
		g := &gossip{meta: data, log: log, members: map[string]gossipMember{}, changed: make(chan struct{}, 1)}
		n := &memberlist.Node{Name: "peer", Addr: net.IPv4(127, 0, 0, 1), Port: 7946, Meta: data, State: memberlist.StateAlive}
		g.NotifyJoin(n)
		g.NotifyUpdate(n)
		if got := g.members["peer"]; got.Health != HealthAlive || got.ID != "peer" {
			t.Fatalf("after join: %+v", got)
		}
		n.State = memberlist.StateLeft
		g.NotifyLeave(n)
		if got := g.members["peer"]; got.Health != HealthLeft {
			t.Fatalf("after leave: %+v", got)
		}
		g.NotifyMsg(data)
		g.MergeRemoteState(data, true)
		g.MergeRemoteState(data, false)
		_ = g.LocalState(true)
		_ = g.GetBroadcasts(0, 1400)
		if out := g.NodeMeta(memberlist.MetaMaxSize); len(out) > memberlist.MetaMaxSize {
			t.Fatalf("NodeMeta returned %d bytes over the limit", len(out))
		}
	})
}
