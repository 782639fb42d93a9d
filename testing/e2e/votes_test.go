package e2e

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.etcd.io/bbolt"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// metaTerms reads the meta group's term and vote from a stopped node's
// meta/raft.db (raft-boltdb keeps them in its "conf" bucket).
func metaTerms(t *testing.T, dataDir string) (term, voteTerm uint64, cand string) {
	t.Helper()
	db, err := bbolt.Open(filepath.Join(dataDir, "meta", "raft.db"), 0o600, &bbolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.View(func(tx *bbolt.Tx) error {
		b := tx.Bucket([]byte("conf"))
		if b == nil {
			return nil
		}
		if v := b.Get([]byte("CurrentTerm")); len(v) == 8 {
			term = binary.BigEndian.Uint64(v)
		}
		if v := b.Get([]byte("LastVoteTerm")); len(v) == 8 {
			voteTerm = binary.BigEndian.Uint64(v)
		}
		cand = string(b.Get([]byte("LastVoteCand")))
		return nil
	})
	return term, voteTerm, cand
}

// boltUsed is how much of a bbolt file its pages take.
func boltUsed(t *testing.T, path string) (n int64) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.View(func(tx *bbolt.Tx) error { n = tx.Size(); return nil })
	return n
}

// metaStatus is the meta group as one node sees it.
func metaStatus(ctx context.Context, t *testing.T, addr string) *taskstorepb.ShardStatus {
	t.Helper()
	st, err := taskstorepb.NewAdminClient(dialNode(t, addr)).Status(ctx, &taskstorepb.StatusRequest{LocalOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	return st.Meta
}

// TestEmptiedMetaRaftDBNeverVotesTwice with real
// processes: a node whose meta/raft.db was emptied while it was stopped
// forgot the term and the vote it had given in it, silently, and would
// give that vote again to another candidate: how Raft elects two leaders.
// The test plays the candidate of 50 elections in the term the node had
// voted in (flagged as a leadership transfer, so that the node's knowing a
// leader does not refuse them on its own), from the moment it is back
// until well after it caught up, and wants 0 votes granted. Real
// elections cannot ask for a vote in a term the cluster has left (a
// delayed or duplicated request can), so this plays them;
// TestLostStableStoreRealElections holds real ones.
func TestEmptiedMetaRaftDBNeverVotesTwice(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	pc := harness.StartProcesses(t, 3, "--raft-timeout-scale", "2")
	pc.WaitReady(60 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bad := pc.Nodes[2]

	// A term in which the node voted, and for whom: the meta group's
	// first election normally has every node's vote; otherwise a paused
	// leader makes another election.
	var term uint64
	var voted string
	for attempt := 0; ; attempt++ {
		bad.Stop()
		var voteTerm uint64
		term, voteTerm, voted = metaTerms(t, bad.DataDir())
		if voteTerm == term && voted != "" {
			break
		}
		if attempt == 5 {
			t.Fatalf("%s never voted in its current meta term (%d, voted in %d)", bad.ID, term, voteTerm)
		}
		if err := bad.Start(); err != nil {
			t.Fatal(err)
		}
		pc.WaitReady(60 * time.Second)
		leader := pc.Node(metaStatus(ctx, t, pc.Nodes[0].Addr).Leader)
		if leader == nil || leader == bad {
			continue
		}
		leader.Pause()
		time.Sleep(8 * time.Second)
		leader.Resume()
		pc.WaitReady(60 * time.Second)
	}
	// The candidate: a member the node did not vote for in that term.
	var cand *harness.Process
	for _, p := range pc.Nodes[:2] {
		if p.ID != voted && p.Addr != voted {
			cand = p
		}
	}
	t.Logf("%s voted for %s in meta term %d; %s asks for its vote in that term", bad.ID, voted, term, cand.ID)

	path := filepath.Join(bad.DataDir(), "meta", "raft.db")
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	if err := bad.Start(); err != nil {
		t.Fatal(err)
	}
	granted, answered := 0, 0
	var roles []string
	for i := 0; i < 50; i++ {
		resp, err := harness.RequestVote(bad.Addr, 0, &raft.RequestVoteRequest{
			RPCHeader:          raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(cand.ID), Addr: []byte(cand.Addr)},
			Term:               term,
			LastLogIndex:       1 << 40,
			LastLogTerm:        term,
			LeadershipTransfer: true,
		})
		if err == nil {
			answered++
			if resp.Granted {
				granted++
				t.Errorf("election %d: %s granted %s its vote in term %d, in which it had voted for %s", i+1, bad.ID, cand.ID, term, voted)
			}
		}
		if i%10 == 9 {
			if bad.Ready() {
				roles = append(roles, metaStatus(ctx, t, bad.Addr).ReplicaStatus[0].GetRole())
			}
		}
		time.Sleep(300 * time.Millisecond)
	}
	t.Logf("%d of 50 vote requests answered, %d granted; %s's meta role every 10: %v", answered, granted, bad.ID, roles)
	if answered < 25 {
		t.Fatalf("only %d of 50 vote requests answered", answered)
	}

	// It follows the meta group again and the cluster works through it.
	pc.WaitReady(60 * time.Second)
	deadline := time.Now().Add(60 * time.Second)
	for {
		rs := metaStatus(ctx, t, bad.Addr).ReplicaStatus[0]
		if rs.GetRole() == "follower" || rs.GetRole() == "leader" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's meta replica: %v, want it to follow and vote again", bad.ID, rs)
		}
		time.Sleep(200 * time.Millisecond)
	}
	cl, err := client.Dial(ctx, bad.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Insert(ctx, "votes/q", []byte("x")); err != nil {
		t.Fatal(err)
	}
	log, _ := os.ReadFile(bad.Log)
	if !strings.Contains(string(log), "restored them from its vote record") {
		t.Errorf("%s did not say it restored its term and vote", bad.ID)
	}
}

// TestMetaRaftDBCutToHalfProcesses: a node whose
// meta/raft.db was cut to half died of SIGBUS at start. Now the file is
// moved aside, the meta replica refills from its peers without voting
// until it caught up, and the node runs its shards meanwhile.
func TestMetaRaftDBCutToHalfProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	pc := harness.StartProcesses(t, 3, "--raft-timeout-scale", "2")
	pc.WaitReady(60 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cl := pc.Dial(ctx)
	for i := range 20 {
		if _, err := cl.Insert(ctx, "half/q", []byte("x"), client.WithID(fmt.Sprintf("h%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	bad := pc.Nodes[2]
	bad.Stop()
	path := filepath.Join(bad.DataDir(), "meta", "raft.db")
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	// bbolt grows its file ahead of use: cut half of what it uses.
	used := boltUsed(t, path)
	cut := min(info.Size(), used) / 2
	if err := os.Truncate(path, cut); err != nil {
		t.Fatal(err)
	}
	t.Logf("meta/raft.db cut from %d bytes (%d in use) to %d", info.Size(), used, cut)
	if err := bad.Start(); err != nil {
		t.Fatal(err)
	}
	pc.WaitReady(60 * time.Second)
	if !bad.Running() || !bad.Ready() {
		t.Fatalf("%s did not start", bad.ID)
	}
	// Its shards serve through it, and its meta replica follows again.
	local := dialNode(t, bad.Addr)
	deadline := time.Now().Add(60 * time.Second)
	for {
		rs := metaStatus(ctx, t, bad.Addr).ReplicaStatus[0]
		res, err := taskstorepb.NewTaskStoreClient(local).Tasks(ctx, &taskstorepb.TasksRequest{Queue: "half/q", Limit: 100})
		if err == nil && len(res.Tasks) == 20 && rs.GetRole() == "follower" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: meta replica %v, tasks read through it: %d (%v)", bad.ID, rs, len(res.GetTasks()), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	moved, _ := filepath.Glob(path + ".damaged-*")
	log, _ := os.ReadFile(bad.Log)
	if len(moved) != 1 || !strings.Contains(string(log), "the meta group's raft.db is damaged") {
		t.Fatalf("damaged file kept as %v; the log says it: %v", moved, strings.Contains(string(log), "raft.db is damaged"))
	}
	if strings.Contains(string(log), "SIGBUS") {
		t.Fatal("SIGBUS")
	}
}

// TestMetaRaftDBAndVoteRecordBothGone: a stopped node's meta/raft.db
// emptied and its meta/vote removed left nothing in meta/ to say the
// replica had ever voted: it started as a new replica, bootstrapped from
// --initial-cluster, and would vote in any term (twice in one, or for a
// candidate missing entries it had acknowledged). The data directory's
// meta-voted mark says it had: the replica refills from its leader, stays
// held (taskctl status) for good, and refuses the votes of real
// elections; the meta group elects its leaders without it.
func TestMetaRaftDBAndVoteRecordBothGone(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	pc := harness.StartProcesses(t, 5, "--raft-timeout-scale", "1")
	pc.WaitReady(90 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	bad := pc.Nodes[4]
	bad.Stop()
	if _, err := os.Stat(filepath.Join(bad.DataDir(), "meta-voted")); err != nil {
		t.Fatalf("no meta-voted mark: %v", err)
	}
	if err := os.Truncate(filepath.Join(bad.DataDir(), "meta", "raft.db"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(bad.DataDir(), "meta", "vote")); err != nil {
		t.Fatal(err)
	}
	if err := bad.Start(); err != nil {
		t.Fatal(err)
	}
	pc.WaitReady(90 * time.Second)
	// It follows (it has the map) but stays held.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		m := metaStatus(ctx, t, bad.Addr)
		if m.Leader != "" && m.ReplicaStatus[0].GetLag() == 0 && m.ReplicaStatus[0].GetAppliedIndex() > 0 {
			if role := m.ReplicaStatus[0].GetRole(); role != "held" {
				t.Fatalf("%s's meta replica is %q after losing raft.db and its vote record, want held", bad.ID, role)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's meta replica never followed: %v", bad.ID, m)
		}
	}
	// Ten real meta elections: the leader paused until another leads.
	healthy := pc.Nodes[:4]
	for e := 0; e < 10; e++ {
		m := metaStatus(ctx, t, healthy[e%4].Addr)
		lead := pc.Node(m.Leader)
		if lead == nil || lead == bad {
			t.Fatalf("meta leader %q", m.Leader)
		}
		lead.Pause()
		var watcher *harness.Process
		for _, p := range healthy {
			if p != lead {
				watcher = p
				break
			}
		}
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if w := metaStatus(ctx, t, watcher.Addr); w.Leader != "" && w.Leader != lead.ID && w.Term > m.Term {
				break
			}
			if time.Now().After(deadline) {
				lead.Resume()
				t.Fatalf("election %d: no new meta leader", e+1)
			}
		}
		lead.Resume()
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if l := metaStatus(ctx, t, lead.Addr); l.Term > m.Term && l.Leader != "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s did not follow after its pause", lead.ID)
			}
		}
	}
	answers, _ := voteAnswers(t, bad.Log)
	held := 0
	for _, a := range answers {
		if a.group == "meta" && !a.held {
			t.Errorf("line %d: meta vote request answered unheld (granted %v) in term %d", a.line, a.granted, a.term)
		}
		if a.held {
			held++
		}
	}
	if held < 10 {
		t.Errorf("%s refused %d vote requests across 10 elections, want every election to ask it", bad.ID, held)
	}
	m := metaStatus(ctx, t, bad.Addr)
	if m.ReplicaStatus[0].GetRole() != "held" || !strings.Contains(m.ReplicaStatus[0].GetDivergence().GetDamaged(), "until rebuilt") {
		t.Errorf("%s's meta replica after the elections: %v", bad.ID, m.ReplicaStatus[0])
	}
	t.Logf("%s refused %d vote and pre-vote requests across 10 meta elections, held: %s", bad.ID, held, m.ReplicaStatus[0].GetDivergence().GetDamaged())
	log, _ := os.ReadFile(bad.Log)
	if !strings.Contains(string(log), "vote record are both gone") {
		t.Errorf("%s did not say its raft.db and vote record are both gone", bad.ID)
	}
}
