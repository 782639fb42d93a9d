package cluster

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// keptStable writes the vote record before raft.db, and restoreTerms
// brings an emptied raft.db back up to it.
func TestVoteRecordRestoresAnEmptiedRaftDB(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "raft.db")
	store, err := openBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	kept, lost, _, err := keepTerms(store, dir, slog.Default())
	if err != nil || lost {
		t.Fatal(err, lost)
	}
	if err := kept.SetUint64(keyCurrentTerm, 9); err != nil {
		t.Fatal(err)
	}
	if err := kept.SetUint64(keyLastVoteTerm, 9); err != nil {
		t.Fatal(err)
	}
	if err := kept.Set(keyLastVoteCand, []byte("n2")); err != nil {
		t.Fatal(err)
	}
	store.Close()
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	if store, err = openBolt(path); err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if _, lost, proven, err := keepTerms(store, dir, slog.Default()); err != nil || !lost || !proven {
		t.Fatalf("keepTerms on an emptied raft.db: lost %v proven %v err %v", lost, proven, err)
	}
	if got := stableTerms(store); got.Term != 9 || got.VoteTerm != 9 || !bytes.Equal(got.Cand, []byte("n2")) {
		t.Fatalf("restored %+v, want term 9, vote for n2 in 9", got)
	}
}

// A held replica answers vote and pre-vote requests with a refusal without
// handing them to raft, passes the rest on and fails its own vote
// requests. (That it votes again once caught up is shown with real
// processes: TestEmptiedMetaRaftDBNeverVotesTwice.)
func TestVoteHoldRefusesUntilCaughtUp(t *testing.T) {
	for _, proven := range []bool{true, false} {
		h := newVoteHold("lost its log", proven, slog.Default())
		in := make(chan raft.RPC)
		out := h.filter(in)
		send := func(cmd any) (raft.RPCResponse, bool) {
			t.Helper()
			resp := make(chan raft.RPCResponse, 1)
			in <- raft.RPC{Command: cmd, RespChan: resp}
			select {
			case r := <-resp:
				return r, false
			case rpc := <-out:
				rpc.Respond(nil, nil)
				return <-resp, true
			case <-time.After(5 * time.Second):
				t.Fatal("RPC neither answered nor passed on")
				return raft.RPCResponse{}, false
			}
		}
		r, passed := send(&raft.RequestVoteRequest{Term: 5})
		if passed || r.Response.(*raft.RequestVoteResponse).Granted {
			t.Fatalf("held: vote request passed to raft (%v) or granted (%v)", passed, r.Response)
		}
		if _, passed := send(&raft.RequestPreVoteRequest{Term: 5}); passed {
			t.Fatal("held: pre-vote request passed to raft")
		}
		if _, passed := send(&raft.AppendEntriesRequest{Term: 5, LeaderCommitIndex: 7}); !passed {
			t.Fatal("held: append entries not passed to raft")
		}
		tr := serialTransport{hold: h}
		if err := tr.RequestVote("n2", "x", &raft.RequestVoteRequest{}, &raft.RequestVoteResponse{}); !errors.Is(err, errVoteHeld) {
			t.Fatalf("held replica's own vote request: %v", err)
		}
		if h.Held() == "" {
			t.Fatal("Held() empty while held")
		}
		h.close()
	}
}
