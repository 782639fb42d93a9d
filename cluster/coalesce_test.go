package cluster_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestCoalescedWritesKeepTheirOwnOutcome sends many writes at once to one
// shard, half of them refused (an id that exists): writes that queue behind
// the entry in flight share the next entry, and each keeps its own answer,
// its own error code and its own exactly-once session.
func TestCoalescedWritesKeepTheirOwnOutcome(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	const q = "coalesce/q"
	insert(t, c, q, "taken", "x")
	ts := c.TaskStore(q)
	const writers, rounds = 32, 6
	req := func(w, r int) *taskstorepb.ModifyRequest {
		id := fmt.Sprintf("t-%d-%d", w, r)
		if w%2 == 1 {
			id = "taken" // refused: the id exists
		}
		return &taskstorepb.ModifyRequest{Request: &taskstorepb.RequestID{ClientId: fmt.Sprintf("w%d", w), Seq: uint64(r + 1)},
			Inserts: []*taskstorepb.TaskInsert{{Id: id, Queue: q, Value: []byte(id)}}}
	}
	check := func(w, r int, res *taskstorepb.ModifyResponse, err error) error {
		if w%2 == 1 {
			if status.Code(err) != codes.FailedPrecondition {
				return fmt.Errorf("writer %d round %d: insert of an existing id: %v %v, want FailedPrecondition", w, r, res, err)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("writer %d round %d: %w", w, r, err)
		}
		if len(res.Inserted) != 1 || res.Inserted[0].Id != fmt.Sprintf("t-%d-%d", w, r) {
			return fmt.Errorf("writer %d round %d: answered %v", w, r, res)
		}
		return nil
	}
	before := gatherMetrics(t, c)
	var wg sync.WaitGroup
	errs := make(chan error, writers*rounds*2)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				res, err := ts.Modify(ctxT(t, 30*time.Second), req(w, r))
				if status.Code(err) == codes.Unavailable {
					// Leadership moved on a starved machine: the same
					// request id makes the retry safe.
					res, err = ts.Modify(ctxT(t, 30*time.Second), req(w, r))
				}
				errs <- check(w, r, res, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	// A retry of the last round is answered from its session, as before.
	for w := range writers {
		res, err := ts.Modify(ctxT(t, 30*time.Second), req(w, rounds-1))
		if err := check(w, rounds-1, res, err); err != nil {
			t.Errorf("retry: %v", err)
		}
	}
	after := gatherMetrics(t, c)
	key := fmt.Sprintf(",shard=%d", c.ShardOf(q))
	requests := after["taskstore_shard_proposed_requests_total"+key] - before["taskstore_shard_proposed_requests_total"+key]
	entries := after["taskstore_shard_proposed_entries_total"+key] - before["taskstore_shard_proposed_entries_total"+key]
	t.Logf("%v writes proposed in %v entries", requests, entries)
	if requests < writers*rounds || entries >= requests {
		t.Errorf("%v writes proposed in %v entries: want at least %d writes, sharing entries", requests, entries, writers*rounds)
	}
	res, err := ts.Tasks(ctxT(t, 10*time.Second), &taskstorepb.TasksRequest{Queue: q, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if want := writers/2*rounds + 1; len(res.Tasks) != want {
		t.Errorf("%d tasks in the queue, want %d", len(res.Tasks), want)
	}
}

// waitQueued waits until n writes queue on the shard.
func waitQueued(t *testing.T, s interface{ QueuedProposals() int }, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for s.QueuedProposals() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d writes queued, want %d", s.QueuedProposals(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestQueuedWriteIsDroppedWhenItsCallerLeaves: a write whose caller gave up
// while it queued behind the entry in flight is never proposed, and the
// writes queued with it are.
func TestQueuedWriteIsDroppedWhenItsCallerLeaves(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	const q = "coalesce/cancel"
	shard := c.ShardOf(q)
	insert(t, c, q, "first", "x")
	ts := c.TaskStore(q)
	s := c.Nodes[c.Leader(shard)].Server().Node.Shard(shard)
	release := s.HoldProposals()
	gaveUp := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		_, err := ts.Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Id: "abandoned", Queue: q}}})
		gaveUp <- err
	}()
	waitQueued(t, s, 1)
	kept := make(chan error, 1)
	go func() {
		_, err := ts.Modify(ctxT(t, 30*time.Second), &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Id: "kept", Queue: q}}})
		kept <- err
	}()
	waitQueued(t, s, 2)
	if err := <-gaveUp; status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("the write whose caller gave up: %v, want DeadlineExceeded", err)
	}
	waitQueued(t, s, 1) // the node saw its caller leave (its deadline ends there a little later)
	release()
	if err := <-kept; err != nil {
		t.Fatalf("the write queued with it: %v", err)
	}
	if get(t, c, q, "kept") == nil {
		t.Fatal("the kept write is not in the queue")
	}
	if get(t, c, q, "abandoned") != nil {
		t.Fatal("a write was proposed after its caller gave up while it queued")
	}
}

// TestQueuedWritesFailWhenLeadershipMoves: writes queued behind the entry
// in flight when the leader loses its leadership are answered "not leader"
// (Unavailable, never proposed: safe to retry anywhere), none hangs.
func TestQueuedWritesFailWhenLeadershipMoves(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	const q = "coalesce/leader"
	shard := c.ShardOf(q)
	insert(t, c, q, "first", "x")
	ts := c.TaskStore(q)
	s := c.Nodes[c.Leader(shard)].Server().Node.Shard(shard)
	release := s.HoldProposals()
	const n = 4
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := ts.Modify(ctxT(t, 60*time.Second), &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Id: fmt.Sprint("queued-", i), Queue: q}}})
			errs <- err
		}()
	}
	waitQueued(t, s, n)
	if err := c.TransferLeader(shard, -1); err != nil {
		t.Fatal(err)
	}
	release()
	for range n {
		if err := <-errs; status.Code(err) != codes.Unavailable {
			t.Errorf("a write queued when the leadership moved: %v, want Unavailable", err)
		}
	}
	for i := range n {
		if get(t, c, q, fmt.Sprint("queued-", i)) != nil {
			t.Errorf("queued-%d was applied though its caller was told it was not", i)
		}
	}
}

// TestOneEntryAnswersEachWrite queues writes of different kinds behind a
// held entry so that they go out as one entry: an insert, an insert of an
// id that exists (refused), a claim and a retry of an earlier request id;
// each gets its own answer and code, and the refused one changes nothing.
func TestOneEntryAnswersEachWrite(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale})
	c.WaitReady()
	const q = "coalesce/one"
	shard := c.ShardOf(q)
	ts := c.TaskStore(q)
	first := &taskstorepb.ModifyRequest{Request: &taskstorepb.RequestID{ClientId: "r", Seq: 1},
		Inserts: []*taskstorepb.TaskInsert{{Id: "a", Queue: q, Value: []byte("a")}}}
	if _, err := ts.Modify(ctxT(t, 30*time.Second), first); err != nil {
		t.Fatal(err)
	}
	leader := c.Leader(shard)
	s := c.Nodes[leader].Server().Node.Shard(shard)
	before := gatherMetrics(t, c)
	release := s.HoldProposals()
	type answer struct {
		name string
		err  error
		ok   bool
	}
	answers := make(chan answer, 4)
	go func() {
		res, err := ts.Modify(ctxT(t, 60*time.Second), &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Id: "b", Queue: q}}})
		answers <- answer{"insert", err, err == nil && len(res.Inserted) == 1 && res.Inserted[0].Id == "b"}
	}()
	go func() {
		_, err := ts.Modify(ctxT(t, 60*time.Second), &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Id: "a", Queue: q}, {Id: "c", Queue: q}}})
		answers <- answer{"refused", err, status.Code(err) == codes.FailedPrecondition}
	}()
	go func() {
		res, err := ts.Claim(ctxT(t, 60*time.Second), &taskstorepb.ClaimRequest{Claimant: "w", Queues: []string{q},
			Request: &taskstorepb.RequestID{ClientId: "claimer", Seq: 1}})
		answers <- answer{"claim", err, err == nil && len(res.Tasks) == 1}
	}()
	go func() {
		res, err := ts.Modify(ctxT(t, 60*time.Second), first)
		answers <- answer{"retry", err, err == nil && len(res.Inserted) == 1 && res.Inserted[0].Id == "a"}
	}()
	waitQueued(t, s, 4)
	release()
	for range 4 {
		a := <-answers
		if !a.ok {
			t.Errorf("%s: %v", a.name, a.err)
		}
	}
	after := gatherMetrics(t, c)
	key := fmt.Sprintf(",shard=%d", shard)
	// Requests beyond entries: 3 when the four shared one entry, whatever
	// else (a format step, a tick) the shard proposed alone meanwhile.
	delta := func(name string) float64 { return after[name+key] - before[name+key] }
	if d := delta("taskstore_shard_proposed_requests_total") - delta("taskstore_shard_proposed_entries_total"); d != 3 {
		t.Errorf("the four writes and any others: %v requests more than entries, want 3 (the four in one entry)", d)
	}
	if get(t, c, q, "b") == nil {
		t.Error("b was not inserted")
	}
	if get(t, c, q, "c") != nil {
		t.Error("c was inserted by a refused request")
	}
}

// TestCoalescedEntryBoundAndOneBudget holds a shard's proposals while
// writes of many sizes queue, then reads the entries the leader wrote in
// its Raft log: no entry of several writes is over Tuning.CoalesceBytes,
// counting its head and each write's framing, and the memory budget is in
// each entry once: in a batch's head, never in its writes; in a write
// proposed alone, once.
func TestCoalescedEntryBoundAndOneBudget(t *testing.T) {
	const maxBytes = 2048
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: raceScale, StateStore: cluster.StateInMemory, MemoryLimit: 1 << 30,
		Tune: func(tu *cluster.Tuning) { tu.CoalesceBytes, tu.CoalesceRequests = maxBytes, 1000 }})
	c.WaitReady()
	const q = "coalesce/bound"
	shard := c.ShardOf(q)
	insert(t, c, q, "first", "x")
	ts := c.TaskStore(q)
	leader := c.Leader(shard)
	s := c.Nodes[leader].Server().Node.Shard(shard)
	from, err := s.Log().LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	release := s.HoldProposals()
	const n = 200
	errs := make(chan error, n)
	for i := range n {
		// Sizes from 80 to 330 bytes: the writes of a batch fill the bound
		// to within a few bytes of it, over it when framing is not counted.
		value := strings.Repeat("v", 80+(i*37)%251)
		go func() {
			_, err := ts.Modify(ctxT(t, 60*time.Second), &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Id: fmt.Sprint("b-", i), Queue: q, Value: []byte(value)}}})
			errs <- err
		}()
	}
	waitQueued(t, s, n)
	release()
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if c.Leader(shard) != leader {
		t.Skip("the leadership moved while the writes were proposed (a starved machine)")
	}
	last, err := s.Log().LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	batches, carried := 0, 0
	for i := from + 1; i <= last; i++ {
		var l raft.Log
		if err := s.Log().GetLog(i, &l); err != nil {
			t.Fatal(err)
		}
		if l.Type != raft.LogCommand || len(l.Data) == 0 {
			continue
		}
		cmd, err := fsm.DecodeCommand(l.Data)
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
		switch cmd.Op {
		case fsmpb.Op_OP_BATCH:
			batches++
			carried += len(cmd.Batch)
			if len(l.Data) > maxBytes {
				t.Errorf("entry %d: an OP_BATCH of %d writes is %d bytes, over the bound of %d", i, len(cmd.Batch), len(l.Data), maxBytes)
			}
			top, inner := budgetFields(t, l.Data)
			if top != 1 {
				t.Errorf("entry %d: the batch's head carries %d budgets, want 1", i, top)
			}
			for j, k := range inner {
				if k != 0 {
					t.Errorf("entry %d: write %d of the batch carries %d budgets of its own, want none (the head's)", i, j, k)
				}
			}
		case fsmpb.Op_OP_MODIFY:
			if top, _ := budgetFields(t, l.Data); top != 1 {
				t.Errorf("entry %d: a write proposed alone carries %d budgets, want 1", i, top)
			}
		}
	}
	t.Logf("%d entries, %d batches carrying %d writes", last-from, batches, carried)
	if batches == 0 || carried < n/2 {
		t.Fatalf("%d batches carrying %d of %d writes: the writes did not share entries", batches, carried, n)
	}
}

// budgetFields counts the Command.budget fields of an encoded command
// (top) and of each command of its batch (inner), as raw fields: a second
// stamp would merge into one when decoded.
func budgetFields(t *testing.T, data []byte) (top int, inner []int) {
	t.Helper()
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			t.Fatalf("a malformed command: %v", protowire.ParseError(n))
		}
		data = data[n:]
		if typ == protowire.BytesType && (num == 13 || num == 20) {
			v, m := protowire.ConsumeBytes(data)
			if m < 0 {
				t.Fatalf("a malformed command: %v", protowire.ParseError(m))
			}
			if num == 20 {
				top++
			} else {
				k, _ := budgetFields(t, v)
				inner = append(inner, k)
			}
			data = data[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, data)
		if m < 0 {
			t.Fatalf("a malformed command: %v", protowire.ParseError(m))
		}
		data = data[m:]
	}
	return top, inner
}
