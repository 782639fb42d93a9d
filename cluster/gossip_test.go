package cluster

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"
)

// freeUDPAndTCPPort finds a port free for both (memberlist binds both).
func freeGossipPort(t *testing.T) string {
	t.Helper()
	for i := 0; i < 50; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		u, err := net.ListenPacket("udp", addr)
		l.Close()
		if err == nil {
			u.Close()
			return addr
		}
	}
	t.Fatal("no free gossip port")
	return ""
}

func startTestGossip(t *testing.T, id, label string, keys ...[]byte) *gossip {
	t.Helper()
	g, err := startGossip(gossipConfig{ID: id, BindAddr: freeGossipPort(t), Keys: keys, Label: label},
		gossipMeta{Address: "127.0.0.1:1"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.leave(false) })
	return g
}

// TestGossipKeysAndLabelKeepClustersApart: nodes that share the key and the
// label see each other; a node with another key, with no key, or with
// another cluster's label is ignored, and key rotation (a node that knows
// the old and the new key) keeps working.
func TestGossipKeysAndLabelKeepClustersApart(t *testing.T) {
	k1 := []byte("0123456789abcdef0123456789abcdef")
	k2 := []byte("fedcba9876543210fedcba9876543210")
	a := startTestGossip(t, "a", "taskstore/one", k1)
	b := startTestGossip(t, "b", "taskstore/one", k1)
	if _, err := b.join([]string{a.ml.LocalNode().Address()}); err != nil {
		t.Fatalf("same key and label: %v", err)
	}
	for _, tc := range []struct {
		name  string
		label string
		keys  [][]byte
	}{
		{"another key", "taskstore/one", [][]byte{k2}},
		{"no key", "taskstore/one", nil},
		{"another cluster's label", "taskstore/two", [][]byte{k1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := startTestGossip(t, "x-"+tc.name, tc.label, tc.keys...)
			if n, err := x.join([]string{a.ml.LocalNode().Address()}); err == nil && n > 0 {
				t.Errorf("join answered by %d node(s), want none", n)
			}
			time.Sleep(500 * time.Millisecond)
			for _, g := range []*gossip{a, b} {
				if _, ok := g.snapshot()["x-"+tc.name]; ok {
					t.Errorf("%s sees the outsider", g.ml.LocalNode().Name)
				}
			}
		})
	}
	// Key rotation (docs/security.md): first every node learns the new key
	// as a second one (r), then nodes make it primary (s: encrypts with k2,
	// still reads k1). s talks to r, which knows k2, and is heard by it.
	r := startTestGossip(t, "r", "taskstore/one", k1, k2)
	if _, err := r.join([]string{a.ml.LocalNode().Address()}); err != nil {
		t.Fatalf("node with both keys, old one primary: %v", err)
	}
	waitMembers(t, a, "a", "b", "r")
	s := startTestGossip(t, "s", "taskstore/one", k2, k1)
	if _, err := s.join([]string{r.ml.LocalNode().Address()}); err != nil {
		t.Fatalf("node with both keys, new one primary, joining one that knows both: %v", err)
	}
	waitMembers(t, r, "r", "s")
}

func waitMembers(t *testing.T, g *gossip, ids ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m := g.snapshot()
		missing := ""
		for _, id := range ids {
			if mm, ok := m[id]; !ok || mm.Health != HealthAlive {
				missing += fmt.Sprint(" ", id)
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("members missing:%s", missing)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
