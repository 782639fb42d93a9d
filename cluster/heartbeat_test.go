package cluster_test

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestNewerTermHeartbeatDoesNotLetLeaderStampItsTerm forces the interleaving
// of hashicorp/raft#695 that made shard 2's replicas diverge
// (testing/checker/testdata/replica-divergence): a leader of term T, idle in its
// main loop, receives a heartbeat of term T+1, and a client's Apply reaches
// it right after. On raft's heartbeat fast path the heartbeat sets term T+1
// and "follower" on the transport's goroutine while the leader loop stays
// parked in its select; the Apply then wakes the loop, which stamps the
// entry with term T+1, a term this node never led, at an index the real
// leader of T+1 fills with its own entry. Followers match (index, term) and
// keep theirs, so the replicas apply different entries for good.
//
// The heartbeat is sent as a peer would, over the node's own port. The
// command is applied at the old leader only, so an entry of term T+1 that
// carries it is one a node wrote for a term it did not lead. Other entries
// of T+1 are legitimate: once the leader stepped down, a follower may win
// the election of T+1 before the old leader times out (seen under -race on
// a loaded machine: the winner's barrier, stamped T+1).

func TestNewerTermHeartbeatDoesNotLetLeaderStampItsTerm(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	const shard = 1
	for attempt := 1; attempt <= 3; attempt++ {
		l := waitLeader(t, c, shard)
		sh := c.Nodes[l].Server().Node.Shard(shard)
		r := sh.Raft()
		// A peer to impersonate: any other voter.
		peer := (l + 1) % len(c.Nodes)
		term, err := strconv.ParseUint(r.Stats()["term"], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		// Let the leader loop go idle (nothing in flight).
		time.Sleep(200 * time.Millisecond)

		sendHeartbeat(t, c.Nodes[l].ID, c.Nodes[l].Addr, c.Nodes[peer].ID, c.Nodes[peer].Addr, shard, term+1)
		data, err := fsm.EncodeCommand(&fsmpb.Command{Now: time.Now().UnixNano(), Modify: &fsmpb.Modify{
			Group:   "hb",
			Inserts: []*fsmpb.Insert{{Id: fmt.Sprintf("stamped-%d", attempt), Queue: "hb"}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		applyErr := r.Apply(data, 5*time.Second).Error()
		t.Logf("attempt %d: leader %s of term %d got a heartbeat of term %d; a following Apply returned %v",
			attempt, c.Nodes[l].ID, term, term+1, applyErr)

		for i := range c.Nodes {
			store := c.Nodes[i].Server().Node.Shard(shard).Log()
			last, err := store.LastIndex()
			if err != nil {
				t.Fatal(err)
			}
			first, _ := store.FirstIndex()
			for idx := last; idx >= first && idx > 0; idx-- {
				var e raft.Log
				if err := store.GetLog(idx, &e); err != nil {
					t.Fatal(err)
				}
				if e.Term < term+1 {
					break
				}
				if e.Term == term+1 && e.Type == raft.LogCommand && bytes.Equal(e.Data, data) {
					t.Fatalf("attempt %d: %s's log holds the command applied at %s at index %d stamped term %d, a term %s did not lead: "+
						"it wrote it after a newer-term heartbeat (hashicorp/raft#695)", attempt, c.Nodes[i].ID, c.Nodes[l].ID, idx, e.Term, c.Nodes[l].ID)
				}
			}
		}
		if applyErr == nil {
			t.Fatalf("attempt %d: an Apply after the leader saw a newer term was acknowledged", attempt)
		}
	}
}

// waitLeader waits until shard has a leader.
func waitLeader(t *testing.T, c *harness.Cluster, shard uint32) int {
	t.Helper()
	for end := time.Now().Add(60 * time.Second); time.Now().Before(end); {
		if l := c.Leader(shard); l >= 0 {
			return l
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("shard %d has no leader", shard)
	return -1
}

// sendHeartbeat sends to (toID, toAddr) the heartbeat a leader of term of
// group would send, impersonating (fromID, fromAddr), over a mux of its own.
func sendHeartbeat(t *testing.T, toID, toAddr, fromID, fromAddr string, group uint32, term uint64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := cluster.NewMux(ln, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, nil)
	go mux.Serve()
	defer mux.Close()
	stream, err := mux.StreamLayer(group)
	if err != nil {
		t.Fatal(err)
	}
	trans := raft.NewNetworkTransport(stream, 1, 5*time.Second, io.Discard)
	defer trans.Close()
	req := &raft.AppendEntriesRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(fromID), Addr: []byte(fromAddr)},
		Term:      term,
	}
	var resp raft.AppendEntriesResponse
	if err := trans.AppendEntries(raft.ServerID(toID), raft.ServerAddress(toAddr), req, &resp); err != nil {
		t.Fatalf("heartbeat to %s: %v", toID, err)
	}
	if resp.Term != term {
		t.Fatalf("heartbeat to %s: answered term %d, want %d", toID, resp.Term, term)
	}
}
