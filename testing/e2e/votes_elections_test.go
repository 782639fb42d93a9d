package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// voteRecordTerms reads a group's vote record (cluster/vote.go: term, vote
// term, candidate length, candidate, CRC-32C, big-endian).
func voteRecordTerms(t *testing.T, dir string) (term, voteTerm uint64) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "vote"))
	if err != nil || len(b) < 24 {
		t.Fatalf("vote record of %s: %v (%d bytes)", dir, err, len(b))
	}
	return binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:])
}

// voteAnswer is one "answered a vote request after losing its stable
// store" line of a node's log.
type voteAnswer struct {
	line       int
	group      string // "meta" or the shard's id
	term       uint64
	candidate  string
	granted    bool
	held       bool
	preVote    bool
	provenTerm uint64
}

var logField = regexp.MustCompile(`(\w+)=("(?:[^"\\]|\\.)*"|\S+)`)

// voteAnswers reads the vote answers a node logged, and the line at which
// its meta replica said it votes again (0: never).
func voteAnswers(t *testing.T, path string) (answers []voteAnswer, caughtUp int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if caughtUp == 0 && strings.Contains(line, "group=meta") && strings.Contains(line, "it votes again") {
			caughtUp = n
		}
		if !strings.Contains(line, "request after losing its stable store") {
			continue
		}
		kv := map[string]string{}
		for _, m := range logField.FindAllStringSubmatch(line, -1) {
			kv[m[1]] = strings.Trim(m[2], `"`)
		}
		a := voteAnswer{line: n, group: kv["group"], candidate: kv["candidate"], granted: kv["granted"] == "true",
			held: kv["held"] == "true", preVote: strings.Contains(line, "pre-vote")}
		if a.group == "" {
			a.group = kv["shard"]
		}
		a.term, _ = strconv.ParseUint(kv["term"], 10, 64)
		a.provenTerm, _ = strconv.ParseUint(kv["proven_vote_term"], 10, 64)
		answers = append(answers, a)
	}
	return answers, caughtUp
}

// TestLostStableStoreRealElections, with real processes and real
// elections: a node's meta/raft.db and one shard's raft.db are emptied
// while it is stopped, and it comes back into a five-node cluster whose
// other nodes then hold 50 meta elections (the meta leader paused each
// time) and 50 shard elections (leadership transfers between the shard's
// other replicas), every one asking the node for its vote. A replica that
// forgot its vote could give it twice in a term; one that lost its log
// could elect a leader missing entries it had acknowledged. The node's own
// log of every vote request it answered, and its metrics, must show: no
// vote granted while its meta replica was held (taskctl status says
// "held"), and none in a term at or below the vote term its record proved.
func TestLostStableStoreRealElections(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	pc := harness.StartProcesses(t, 5, "--raft-timeout-scale", "1")
	pc.WaitReady(90 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	bad := pc.Nodes[4]
	healthy := pc.Nodes[:4]

	// A shard the node replicates.
	st, err := taskstorepb.NewAdminClient(dialNode(t, healthy[0].Addr)).Status(ctx, &taskstorepb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var shard uint32
	var others []string
	for _, s := range st.Shards {
		for _, r := range s.Replicas {
			if r == bad.ID {
				shard = s.Id
			}
		}
		if shard != 0 {
			for _, r := range s.Replicas {
				if r != bad.ID {
					others = append(others, r)
				}
			}
			break
		}
	}
	if shard == 0 || len(others) < 2 {
		t.Fatalf("no shard with %s and two other replicas: %v", bad.ID, st.Shards)
	}

	bad.Stop()
	if _, ok := bad.WaitExit(30 * time.Second); !ok {
		t.Fatalf("%s did not stop", bad.ID)
	}
	metaDir := filepath.Join(bad.DataDir(), "meta")
	shardDir := filepath.Join(bad.DataDir(), "shards", fmt.Sprint(shard))
	metaTerm, metaVoteTerm := voteRecordTerms(t, metaDir)
	shardTerm, shardVoteTerm := voteRecordTerms(t, shardDir)
	t.Logf("%s stopped: meta term %d (voted in %d), shard %d term %d (voted in %d); emptying both raft.db files",
		bad.ID, metaTerm, metaVoteTerm, shard, shardTerm, shardVoteTerm)
	for _, dir := range []string{metaDir, shardDir} {
		if err := os.Truncate(filepath.Join(dir, "raft.db"), 0); err != nil {
			t.Fatal(err)
		}
	}

	// While the node is back and before any leader reaches it, no meta
	// election can succeed without its vote: the meta leader and one more
	// node are paused, so the three left need it.
	metaOf := func(p *harness.Process) *taskstorepb.ShardStatus {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		st, err := taskstorepb.NewAdminClient(dialNode(t, p.Addr)).Status(c, &taskstorepb.StatusRequest{LocalOnly: true})
		if err != nil {
			return nil
		}
		return st.Meta
	}
	var leader *harness.Process
	for deadline := time.Now().Add(60 * time.Second); leader == nil || leader == bad; time.Sleep(200 * time.Millisecond) {
		if m := metaOf(healthy[0]); m != nil {
			leader = pc.Node(m.Leader)
		}
		if time.Now().After(deadline) {
			t.Fatal("no meta leader among the healthy nodes")
		}
	}
	var second *harness.Process
	for _, p := range healthy {
		if p != leader {
			second = p
			break
		}
	}
	leader.Pause()
	second.Pause()
	paused := []*harness.Process{leader, second}
	defer func() {
		for _, p := range paused {
			p.Resume()
		}
	}()
	if err := bad.Start(); err != nil {
		t.Fatal(err)
	}
	// taskctl status, asked of the node itself, shows its meta replica held.
	taskctl := filepath.Join(harness.Binaries(t), "taskctl")
	var out []byte
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(time.Second) {
		c, cancel := context.WithTimeout(ctx, 60*time.Second)
		out, err = exec.CommandContext(c, taskctl, "--endpoints", bad.Addr, "-o", "json", "status").CombinedOutput()
		cancel()
		if err == nil && strings.Contains(string(out), `"held"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("taskctl status never showed %s's meta replica held: %v\n%s", bad.ID, err, out)
		}
	}
	out, _ = exec.CommandContext(ctx, taskctl, "--endpoints", bad.Addr, "status").CombinedOutput()
	if !strings.Contains(string(out), "DAMAGED:"+bad.ID) {
		t.Errorf("taskctl status has no DAMAGED:%s on the meta row:\n%s", bad.ID, out)
	}
	// The three nodes left campaign; the node is asked and refuses.
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		held := 0
		for _, a := range func() []voteAnswer { a, _ := voteAnswers(t, bad.Log); return a }() {
			if a.group == "meta" && a.held {
				held++
			}
		}
		if held >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s answered %d vote requests of the meta group while held, want campaigns to ask it", bad.ID, held)
		}
	}
	for _, p := range paused {
		p.Resume()
	}
	paused = nil
	pc.WaitReady(90 * time.Second)

	// 50 meta elections: pause the meta leader until another node leads
	// in a higher term, resume it. The node is never paused.
	metaElections := 0
	for cycle := 0; metaElections < 50; cycle++ {
		if cycle == 80 {
			t.Fatalf("only %d meta elections in %d tries", metaElections, cycle)
		}
		var lead *harness.Process
		var term uint64
		for deadline := time.Now().Add(60 * time.Second); lead == nil; time.Sleep(100 * time.Millisecond) {
			if m := metaOf(healthy[cycle%4]); m != nil && m.Leader != "" {
				lead, term = pc.Node(m.Leader), m.Term
			}
			if time.Now().After(deadline) {
				t.Fatal("no meta leader")
			}
		}
		lead.Pause()
		var watcher *harness.Process
		for _, p := range pc.Nodes {
			if p != lead && p != bad {
				watcher = p
				break
			}
		}
		elected := false
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if m := metaOf(watcher); m != nil && m.Leader != "" && m.Leader != lead.ID && m.Term > term {
				elected = true
				break
			}
		}
		lead.Resume()
		if !elected {
			t.Fatalf("meta election %d: no new leader within 60s of pausing %s", metaElections+1, lead.ID)
		}
		if lead != bad {
			metaElections++
		}
		// The old leader follows the new term before the next round.
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if m := metaOf(lead); m != nil && m.Term > term && m.Leader != "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s did not follow after its pause", lead.ID)
			}
		}
	}

	// 50 shard elections: leadership transfers between the shard's other
	// replicas, each one a vote the node is asked for.
	shardElections := 0
	for try := 0; shardElections < 50; try++ {
		if try == 200 {
			t.Fatalf("only %d shard transfers in %d tries", shardElections, try)
		}
		st, err := taskstorepb.NewAdminClient(dialNode(t, healthy[0].Addr)).Status(ctx, &taskstorepb.StatusRequest{})
		if err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		var from string
		for _, s := range st.Shards {
			if s.Id == shard {
				from = s.Leader
			}
		}
		lead := pc.Node(from)
		if lead == nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		to := others[0]
		if from == others[0] {
			to = others[1]
		}
		c, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err = taskstorepb.NewAdminClient(dialNode(t, lead.Addr)).TransferLeader(c, &taskstorepb.TransferLeaderRequest{Shard: shard, To: to})
		cancel()
		if err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		if lead != bad {
			shardElections++
		}
	}

	// The evidence: every vote request the node answered, from its log.
	answers, caughtUp := voteAnswers(t, bad.Log)
	if caughtUp == 0 {
		t.Fatalf("%s's meta replica never said it votes again", bad.ID)
	}
	count := map[string]map[string]int{"meta": {}, fmt.Sprint(shard): {}}
	for _, a := range answers {
		c, ok := count[a.group]
		if !ok {
			t.Errorf("a vote answer of group %q: only meta and shard %d lost their store", a.group, shard)
			continue
		}
		proven := metaVoteTerm
		if a.group != "meta" {
			proven = shardVoteTerm
		}
		switch {
		case a.held:
			c["held"]++
			if a.group != "meta" {
				t.Errorf("line %d: shard %d's replica was held; only the meta replica lost its log", a.line, shard)
			}
			if a.line > caughtUp {
				t.Errorf("line %d: held after the meta replica said it votes again (line %d)", a.line, caughtUp)
			}
		case a.granted:
			c["granted"]++
			if a.term <= proven {
				t.Errorf("line %d: %s granted %s its %s vote in term %d; its record proved a vote in term %d", a.line, bad.ID, a.candidate, a.group, a.term, proven)
			}
			if a.provenTerm != proven {
				t.Errorf("line %d: the node says its record proved term %d, the file had %d", a.line, a.provenTerm, proven)
			}
			if a.group == "meta" && a.line < caughtUp {
				t.Errorf("line %d: meta vote granted before the replica caught up (line %d)", a.line, caughtUp)
			}
		default:
			c["refused"]++
		}
	}
	t.Logf("%d meta elections, %d shard elections; %s's answers: meta %v, shard %d %v", metaElections, shardElections, bad.ID, count["meta"], shard, count[fmt.Sprint(shard)])
	m := count["meta"]
	if m["held"]+m["granted"]+m["refused"] < 50 {
		t.Errorf("%s answered %d meta vote requests across %d elections, want every election to ask it", bad.ID, m["held"]+m["granted"]+m["refused"], metaElections)
	}
	if s := count[fmt.Sprint(shard)]; s["granted"]+s["refused"] < 50 {
		t.Errorf("%s answered %d shard %d vote requests across %d transfers", bad.ID, s["granted"]+s["refused"], shard, shardElections)
	}

	// Its metrics count the same answers (read again if an answer came in
	// between).
	var missing []string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
		body := scrape(t, bad)
		missing = missing[:0]
		for _, g := range []string{"meta", fmt.Sprint(shard)} {
			for _, ans := range []string{"granted", "refused", "held"} {
				want := fmt.Sprintf(`taskstore_raft_vote_answers_after_loss_total{answer=%q,group=%q} %d`, ans, g, count[g][ans])
				if !strings.Contains(body, want+"\n") {
					missing = append(missing, want)
				}
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		answers, _ = voteAnswers(t, bad.Log)
		count = map[string]map[string]int{"meta": {}, fmt.Sprint(shard): {}}
		for _, a := range answers {
			if c, ok := count[a.group]; ok {
				switch {
				case a.held:
					c["held"]++
				case a.granted:
					c["granted"]++
				default:
					c["refused"]++
				}
			}
		}
	}
	if len(missing) > 0 {
		t.Errorf("metrics lack %v", missing)
	}
}

// scrape reads a node's /metrics.
func scrape(t *testing.T, p *harness.Process) string {
	t.Helper()
	resp, err := http.Get(p.HTTPURL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
