package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/checker"
	"github.com/e1158ecb/taskstore/testing/harness"
	"github.com/e1158ecb/taskstore/testing/workload"
)

// Slot moves survive kill -9: three taskstored processes with
// two shards; a slot holding a few thousand tasks moves between the shards
// while writers insert into its groups (client-chosen ids) and claimers
// claim and delete its tasks, and the leader of the source shard, of the
// target shard or of the meta group is killed the moment the move is seen
// copying, or flipped. The node comes back, the move finishes (done, or
// aborted), and then:
//
//   - every acknowledged insert is there exactly once, unless a commit
//     that may have applied deleted it (checker.Lost, checker.Phantom);
//   - no task version was created or committed twice, no stale commit was
//     accepted (checker.Commits over every claim and delete);
//   - the routing table of every node names the one shard that serves the
//     slot (the target when the move is done, the source when aborted), the
//     other shard's replicas hold none of the slot's tasks, and each of the
//     serving shard's replicas holds all of them;
//   - no node lists a move under way.
func TestSlotMoveSurvivesKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	start := time.Now()
	pc := harness.StartProcesses(t, 3, "--shards", "2", "--raft-timeout-scale", "2")
	pc.WaitReady(60 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cl := pc.Dial(ctx)
	rk := &reshardKill{pc: pc, cl: cl, conns: map[string]*grpc.ClientConn{}}
	for _, p := range pc.Nodes {
		rk.conns[p.ID] = dialNode(t, p.Addr)
	}
	rk.waitFormat(t, ctx)

	// Each victim is killed the moment the move is seen copying (the
	// source may not have frozen the slot yet), 80 ms into the copy (some
	// of its chunks imported) and the moment it is seen flipped.
	cases := []struct {
		victim, phase string
		delay         time.Duration
	}{
		{"source", "copying", 0},
		{"source", "copying", 80 * time.Millisecond},
		{"source", "flipped", 0},
		{"target", "copying", 0},
		{"target", "copying", 80 * time.Millisecond},
		{"target", "flipped", 0},
		{"meta", "copying", 0},
		{"meta", "copying", 80 * time.Millisecond},
		{"meta", "flipped", 0},
	}
	ran, done, attempt := 0, 0, 0
	for _, tc := range cases {
		name := tc.victim + "-leader-" + tc.phase
		if tc.delay > 0 {
			name += "-" + tc.delay.String()
		}
		t.Run(name, func(t *testing.T) {
			ran++
			for try := 1; ; try++ {
				outcome, killed := rk.killCase(t, ctx, attempt, tc.victim, tc.phase, tc.delay)
				attempt++
				if outcome == "done" {
					done++
				}
				if killed || t.Failed() {
					return
				}
				if try == 5 {
					t.Fatalf("%d moves finished before they were seen %s", try, tc.phase)
				}
			}
		})
	}
	// A move may be abandoned (the slot stays where it was) and the checks
	// hold; but a run where many were abandoned tested little of the move
	// (none was in the runs this test was written with: a copy is abandoned
	// only after failing for 30 s).
	if !t.Failed() && done*3 < attempt*2 {
		t.Fatalf("only %d of %d moves finished done: the kills tested little of the move", done, attempt)
	}
	t.Logf("%d cases, %d moves (%d done), in %v", ran, attempt, done, time.Since(start).Round(time.Second))
}

// reshardKill is the cluster the cases share.
type reshardKill struct {
	pc    *harness.ProcessCluster
	cl    *client.Client
	conns map[string]*grpc.ClientConn // by node id: its own replicas and view
}

const (
	reshardGroups   = 3    // groups in the moving slot
	reshardPreload  = 2000 // tasks per group before the move
	reshardValue    = 1024 // bytes of a preloaded task's value: the copy takes a few 1 MiB chunks
	reshardOpTime   = 60 * time.Second
	reshardMoveTime = 2 * time.Minute
)

// localStatus is one node's own view (its copy of the map, its replicas'
// idea of their leaders), nil when it does not answer within timeout.
func (rk *reshardKill) localStatus(ctx context.Context, id string, timeout time.Duration) *taskstorepb.StatusResponse {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, err := taskstorepb.NewAdminClient(rk.conns[id]).Status(cctx, &taskstorepb.StatusRequest{LocalOnly: true})
	if err != nil {
		return nil
	}
	return st
}

// waitFormat waits until both shards' leaders raised the state format to
// the one slot moves need (a shard below it cannot take the move's steps),
// so that the first case's move does not wait for it: each node logs the
// raise it proposes.
func (rk *reshardKill) waitFormat(t *testing.T, ctx context.Context) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		raised := map[string]bool{}
		for _, p := range rk.pc.Nodes {
			data, _ := os.ReadFile(p.Log)
			for _, line := range strings.Split(string(data), "\n") {
				// Raised on a new shard's first election or later by the
				// leader's loop: the same message, with its shard= field.
				if !strings.Contains(line, "raised the shard's state format") {
					continue
				}
				for _, f := range strings.Fields(line) {
					if strings.HasPrefix(f, "shard=") {
						raised[f] = true
					}
				}
			}
		}
		if raised["shard=1"] && raised["shard=2"] {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("state formats not raised within a minute (raised: %v)", raised)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// leaders is who leads what, as the cluster's status says.
type leaders struct {
	meta      string
	shard     map[uint32]string
	preferred map[uint32]string
}

func (rk *reshardKill) leaders(ctx context.Context) (leaders, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := rk.cl.Status(cctx, &taskstorepb.StatusRequest{})
	if err != nil {
		return leaders{}, err
	}
	l := leaders{meta: st.GetMeta().GetLeader(), shard: map[uint32]string{}, preferred: map[uint32]string{}}
	for _, s := range st.Shards {
		l.shard[s.Id], l.preferred[s.Id] = s.Leader, s.PreferredLeader
	}
	return l, nil
}

// settle waits until every node answers, the meta group and both shards
// have leaders, and (for up to 20 s) the shards are led by their preferred
// replicas: a restarted node takes its leaderships back a few seconds
// after it returns, which would otherwise happen in the middle of the next
// case.
func (rk *reshardKill) settle(t *testing.T, ctx context.Context) leaders {
	t.Helper()
	start := time.Now()
	for {
		l, err := rk.leaders(ctx)
		ok := err == nil && l.meta != "" && l.shard[1] != "" && l.shard[2] != ""
		for _, p := range rk.pc.Nodes {
			ok = ok && p.Ready()
		}
		if ok && (time.Since(start) > 20*time.Second || l.shard[1] == l.preferred[1] && l.shard[2] == l.preferred[2]) {
			return l
		}
		if time.Since(start) > 90*time.Second || ctx.Err() != nil {
			t.Fatalf("cluster not settled after %v: leaders %+v, err %v", time.Since(start).Round(time.Second), l, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// killCase runs one case: it returns how its move ended ("done" or
// "aborted") and whether the victim was killed (false when the move
// finished before a poll saw it in the phase).
func (rk *reshardKill) killCase(t *testing.T, ctx context.Context, n int, victim, phase string, delay time.Duration) (string, bool) {
	cl := rk.cl
	caseStart := time.Now()
	l := rk.settle(t, ctx)

	// Pick the direction so that the victim leads nothing else the move
	// needs, when the leaders allow it: the source's (or target's) leader
	// is not the meta leader. (For the meta leader, see below.)
	from, to := uint32(1), uint32(2)
	switch victim {
	case "source":
		if l.shard[1] == l.meta {
			from, to = 2, 1
		}
	case "target":
		if l.shard[2] == l.meta {
			from, to = 2, 1
		}
	}

	// A slot on the source and groups in it, then a few thousand tasks.
	rt, err := cl.Routing(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slots := len(rt.Slots)
	var groups []string
	slot := uint32(0)
	for i := 0; len(groups) < reshardGroups; i++ {
		g := fmt.Sprintf("rk%d-%d", n, i)
		s := uint32(taskstorepb.SlotOf(g, slots))
		switch {
		case len(groups) == 0 && rt.Slots[s] == from:
			slot = s
			groups = append(groups, g)
		case len(groups) > 0 && s == slot:
			groups = append(groups, g)
		}
	}
	h := workload.NewHistory()
	value := make([]byte, reshardValue)
	for gi, g := range groups {
		for b := 0; b < reshardPreload/100; b++ {
			req := &taskstorepb.ModifyRequest{}
			op := &workload.Op{Worker: "preload", Kind: workload.KindInsert}
			for i := 0; i < 100; i++ {
				id := fmt.Sprintf("rk%d-pre-%d-%d", n, gi, b*100+i)
				req.Inserts = append(req.Inserts, &taskstorepb.TaskInsert{Id: id, Queue: g + "/pre", Value: value})
				op.Inserts = append(op.Inserts, workload.Insert{ID: id, Queue: g + "/pre"})
			}
			h.Begin(op)
			cctx, cancel := context.WithTimeout(ctx, reshardOpTime)
			resp, err := cl.Modify(cctx, req)
			cancel()
			for _, tk := range resp.GetInserted() {
				op.Tasks = append(op.Tasks, workload.FromTask(tk))
			}
			h.Finish(op, err)
			if err != nil {
				t.Fatalf("preload: %v", err)
			}
		}
	}

	// The workload: writers insert into the slot's groups, claimers claim
	// (preloaded and new tasks) and commit by deleting.
	var (
		stop      atomic.Bool
		wg        sync.WaitGroup
		slowestMu sync.Mutex
		slowest   time.Duration
	)
	for w := 0; w < 2; w++ {
		wg.Go(func() {
			for i := 0; !stop.Load() && ctx.Err() == nil; i++ {
				id := fmt.Sprintf("rk%d-w%d-%d", n, w, i)
				q := groups[i%len(groups)] + "/live"
				op := h.Begin(&workload.Op{Worker: fmt.Sprintf("writer%d", w), Kind: workload.KindInsert, Inserts: []workload.Insert{{ID: id, Queue: q}}})
				cctx, cancel := context.WithTimeout(ctx, reshardOpTime)
				tk, err := cl.Insert(cctx, q, []byte(id), client.WithID(id))
				cancel()
				if err == nil {
					op.Tasks = []workload.TaskVersion{workload.FromTask(tk)}
				}
				h.Finish(op, err)
				slowestMu.Lock()
				slowest = max(slowest, op.End.Sub(op.Start))
				slowestMu.Unlock()
			}
		})
	}
	for c := 0; c < 2; c++ {
		claimant := fmt.Sprintf("rk%d-claimer%d", n, c)
		wg.Go(func() {
			for i := 0; !stop.Load() && ctx.Err() == nil; i++ {
				q := groups[(i+c)%len(groups)] + []string{"/pre", "/live"}[i%2]
				op := h.Begin(&workload.Op{Worker: claimant, Kind: workload.KindClaim, Claimant: claimant, Queues: []string{q}, Lease: 30 * time.Second})
				cctx, cancel := context.WithTimeout(ctx, reshardOpTime)
				res, err := cl.Claim(cctx, &taskstorepb.ClaimRequest{Claimant: claimant, Queues: []string{q}, Limit: 5, Lease: durationpb.New(30 * time.Second)})
				cancel()
				for _, tk := range res.GetTasks() {
					op.Tasks = append(op.Tasks, workload.FromTask(tk))
				}
				h.Finish(op, err)
				if err != nil || len(op.Tasks) == 0 {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				for _, tk := range op.Tasks {
					del := h.Begin(&workload.Op{Worker: claimant, Kind: workload.KindCommit, Claimant: claimant, Deletes: []workload.Ref{{ID: tk.ID, Version: tk.Version}}})
					cctx, cancel := context.WithTimeout(ctx, reshardOpTime)
					_, err := cl.Modify(cctx, &taskstorepb.ModifyRequest{Claimant: claimant,
						Deletes: []*taskstorepb.TaskRef{{Id: tk.ID, Version: tk.Version, Queue: tk.Queue}}})
					cancel()
					h.Finish(del, err)
				}
			}
		})
	}
	defer func() { // on a failure too
		stop.Store(true)
		wg.Wait()
	}()
	time.Sleep(500 * time.Millisecond)

	// The meta leader should lead neither shard when it is killed: hand
	// its shard's leadership to the node that leads none, right before the
	// move (the leadership balancer hands it back within seconds).
	if victim == "meta" {
		rk.freeMetaLeader(t, ctx)
	}

	// Watch the phase on every node's own map (a poller per node, each
	// every 10 ms: the flipped phase of a slot this size lasts a few tens
	// of milliseconds) and kill the victim the moment the move is seen in
	// the phase (delay after it was first seen in it).
	type kill struct {
		node, role string
		seen       string // the phase as seen, and by whom
		after      time.Duration
	}
	killed := make(chan kill, 1)
	watchStop := make(chan struct{})
	var watchOnce, killOnce sync.Once
	stopWatch := func() { watchOnce.Do(func() { close(watchStop) }) }
	defer stopWatch()
	var seenPhases sync.Map
	var watchers sync.WaitGroup
	moveStart := time.Now()
	for _, p := range rk.pc.Nodes {
		watchers.Go(func() {
			for {
				select {
				case <-watchStop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				if !p.Running() {
					continue
				}
				st := rk.localStatus(ctx, p.ID, 200*time.Millisecond)
				if st == nil {
					continue
				}
				for _, mv := range st.Moves {
					if mv.Slot != slot {
						continue
					}
					first, _ := seenPhases.LoadOrStore(mv.Phase, time.Now())
					if mv.Phase != phase || time.Since(first.(time.Time)) < delay {
						continue
					}
					who := ""
					switch victim {
					case "source":
						who = shardLeader(st, mv.From)
					case "target":
						who = shardLeader(st, mv.To)
					case "meta":
						who = st.GetMeta().GetLeader()
					}
					if who == "" {
						continue // an election: look again
					}
					killOnce.Do(func() {
						// What else the victim leads (roles are not pure
						// when the leaders did not allow it).
						role := victim
						if victim != "meta" && st.GetMeta().GetLeader() == who {
							role += "+meta"
						}
						for _, s := range st.Shards {
							if victim == "meta" && s.Leader == who {
								role += fmt.Sprintf("+shard%d", s.Id)
							}
						}
						after, in := time.Since(moveStart), time.Since(first.(time.Time))
						rk.pc.Node(who).Kill()
						killed <- kill{node: who, role: role, seen: fmt.Sprintf("%s by %s, %v into it", mv.Phase, p.ID, in.Round(time.Millisecond)), after: after}
					})
					return
				}
			}
		})
	}
	go func() {
		watchers.Wait()
		close(killed)
	}()

	cctx, cancel := context.WithTimeout(ctx, reshardOpTime)
	moves, err := cl.MoveSlots(cctx, []uint32{slot}, to)
	cancel()
	if err != nil || len(moves) != 1 {
		t.Fatalf("move slot %d to shard %d: %v %v", slot, to, moves, err)
	}
	mv := moves[0]
	t.Logf("move %d: slot %d (%d tasks in %v) from shard %d to %d; leaders before: meta %s, shard 1 %s, shard 2 %s",
		mv.Id, slot, reshardGroups*reshardPreload, groups, from, to, l.meta, l.shard[1], l.shard[2])

	// The kill, unless the move finished before a poll saw the phase: the
	// caller then tries the case again with another slot (the checks run
	// all the same).
	var k kill
	for k.node == "" {
		select {
		case k = <-killed:
			continue
		case <-time.After(50 * time.Millisecond):
		}
		if rk.finished(ctx, mv.Id) || time.Since(moveStart) > reshardMoveTime {
			stopWatch()
			k = <-killed // the kill the watcher made meanwhile, if any
			break
		}
	}
	stopWatch()
	if k.node != "" {
		t.Logf("kill -9 %s (%s leader) %v after the move began, seen %s", k.node, k.role, k.after.Round(time.Millisecond), k.seen)
		h.Note(checker.CountFaults, "kill -9 %s (%s leader), move %s", k.node, k.role, k.seen)
		victimProc := rk.pc.Node(k.node)
		// A new leader where the victim led, then the victim back.
		rk.waitLeaderNot(t, ctx, victim, mv, k.node)
		time.Sleep(time.Second)
		if err := victimProc.Start(); err != nil {
			t.Fatal(err)
		}
		rk.waitReady(t, victimProc)
	} else {
		var phases []string
		seenPhases.Range(func(p, _ any) bool { phases = append(phases, p.(string)); return true })
		t.Logf("move %d finished before it was seen %s (phases seen: %v): nothing killed", mv.Id, phase, phases)
	}

	cctx, cancel = context.WithTimeout(ctx, reshardMoveTime)
	werr := cl.WaitMoves(cctx, moves, nil)
	if cctx.Err() != nil {
		t.Fatalf("the move did not finish within %v: %v", reshardMoveTime, werr)
	}
	cancel()
	time.Sleep(500 * time.Millisecond) // writes after the move
	stop.Store(true)
	wg.Wait()

	// How it ended, on every node: finished, not under way.
	outcome, why := rk.waitFinished(t, ctx, mv)
	rk.logMove(t, mv.Id)
	serving, other := to, from
	if outcome == "done" {
		h.Count(checker.CountSlotMoves, 1)
	} else {
		serving, other = from, to
		t.Logf("move %d was abandoned (%s): the slot stays on shard %d", mv.Id, why, from)
	}
	for _, p := range rk.pc.Nodes {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		rt, err := taskstorepb.NewAdminClient(rk.conns[p.ID]).Routing(cctx, &taskstorepb.RoutingRequest{})
		cancel()
		if err != nil {
			t.Fatalf("routing at %s: %v", p.ID, err)
		}
		if got := rt.Slots[slot]; got != serving {
			t.Errorf("%s's routing table puts slot %d on shard %d, want %d (move %s)", p.ID, slot, got, serving, outcome)
		}
	}

	// Every acknowledged write, once; no version committed twice.
	final := &workload.Final{Start: time.Now()}
	for _, g := range groups {
		for _, q := range []string{g + "/pre", g + "/live"} {
			for _, tk := range listAll(t, ctx, cl, q) {
				final.Tasks = append(final.Tasks, workload.FromTask(tk))
			}
		}
	}
	final.End = time.Now()
	report := checker.Judge(t, fmt.Sprintf("move %d, %s leader killed %s", mv.Id, victim, phase),
		checker.Input{History: h, Final: final}, 0, caseStart, "slowest-insert="+slowest.Round(time.Millisecond).String())
	t.Logf("checked: %v", report.Checked)
	liveAcked, deletesAcked := 0, 0
	for _, op := range h.Ops() {
		if op.Outcome != workload.OK {
			continue
		}
		if op.Worker != "preload" && op.Kind == workload.KindInsert {
			liveAcked++
		}
		if op.Kind == workload.KindCommit {
			deletesAcked++
		}
	}
	if liveAcked < 20 || deletesAcked < 20 {
		t.Errorf("workload too small to mean anything: %d inserts and %d deletes acknowledged", liveAcked, deletesAcked)
	}

	// Replicas: the other shard holds none of the slot, each replica of
	// the serving shard all of it (followers catch up: wait a little).
	count := func(id string, shard uint32) (int, error) {
		total := 0
		for _, g := range groups {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			res, err := taskstorepb.NewTaskStoreClient(rk.conns[id]).Queues(cctx, &taskstorepb.QueuesRequest{Prefix: g + "/", Shard: shard, Stale: true})
			cancel()
			if err != nil {
				return 0, err
			}
			for _, q := range res.Queues {
				total += int(q.Total)
			}
		}
		return total, nil
	}
	want := len(final.Tasks)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var bad []string
		for _, p := range rk.pc.Nodes {
			if n, err := count(p.ID, other); err != nil || n != 0 {
				bad = append(bad, fmt.Sprintf("%s's replica of shard %d (not serving) holds %d (%v)", p.ID, other, n, err))
			}
			if n, err := count(p.ID, serving); err != nil || n != want {
				bad = append(bad, fmt.Sprintf("%s's replica of shard %d (serving) holds %d of %d (%v)", p.ID, serving, n, want, err))
			}
		}
		if len(bad) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slot's tasks on the replicas: %s", strings.Join(bad, "; "))
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("move %d %s; slot %d on shard %d only: %d tasks on each of its replicas", mv.Id, outcome, slot, serving, want)
	return outcome, k.node != ""
}

// logMove logs what the nodes logged about the move (the mover's steps,
// retries and errors), at most 20 lines.
func (rk *reshardKill) logMove(t *testing.T, id uint64) {
	t.Helper()
	var lines []string
	for _, p := range rk.pc.Nodes {
		data, _ := os.ReadFile(p.Log)
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, fmt.Sprintf(" move=%d ", id)) {
				lines = append(lines, line)
			}
		}
	}
	slices.Sort(lines) // by time: each line starts with it
	if len(lines) > 20 {
		lines = append(lines[:20], fmt.Sprintf("... and %d more", len(lines)-20))
	}
	t.Logf("the nodes' log lines about move %d:\n%s", id, strings.Join(lines, "\n"))
}

// finished reports whether a node lists the move finished.
func (rk *reshardKill) finished(ctx context.Context, id uint64) bool {
	for _, p := range rk.pc.Nodes {
		if !p.Running() {
			continue
		}
		if st := rk.localStatus(ctx, p.ID, 200*time.Millisecond); st != nil {
			for _, f := range st.FinishedMoves {
				if f.Id == id {
					return true
				}
			}
		}
	}
	return false
}

// freeMetaLeader hands the leadership of a shard the meta leader leads to
// the node that leads no shard (best effort: the victim's roles are
// logged at the kill).
func (rk *reshardKill) freeMetaLeader(t *testing.T, ctx context.Context) {
	t.Helper()
	l, err := rk.leaders(ctx)
	if err != nil {
		t.Logf("leaders: %v", err)
		return
	}
	for _, id := range []uint32{1, 2} {
		if l.shard[id] != l.meta {
			continue
		}
		free := ""
		for _, p := range rk.pc.Nodes {
			if p.ID != l.shard[1] && p.ID != l.shard[2] {
				free = p.ID
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := rk.cl.TransferLeader(cctx, &taskstorepb.TransferLeaderRequest{Shard: id, To: free})
		cancel()
		t.Logf("shard %d's leader %s leads the meta group: handed the shard to %s (err %v)", id, l.meta, free, err)
	}
}

// shardLeader is the leader of shard in a node's status ("" when unknown).
func shardLeader(st *taskstorepb.StatusResponse, shard uint32) string {
	for _, s := range st.Shards {
		if s.Id == shard {
			return s.Leader
		}
	}
	return ""
}

// waitLeaderNot waits until the group the victim led has another leader.
func (rk *reshardKill) waitLeaderNot(t *testing.T, ctx context.Context, victim string, mv *taskstorepb.SlotMove, old string) {
	t.Helper()
	start := time.Now()
	for time.Since(start) < time.Minute && ctx.Err() == nil {
		if l, err := rk.leaders(ctx); err == nil {
			now := l.meta
			switch victim {
			case "source":
				now = l.shard[mv.From]
			case "target":
				now = l.shard[mv.To]
			}
			if now != "" && now != old {
				t.Logf("new %s leader %s after %v", victim, now, time.Since(start).Round(time.Millisecond))
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no new %s leader within a minute", victim)
}

// waitReady waits for a restarted node's /readyz.
func (rk *reshardKill) waitReady(t *testing.T, p *harness.Process) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !p.Ready() {
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready a minute after its restart", p.ID)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitFinished waits until every node lists the move finished and none
// lists a move under way, and returns how it ended and why.
func (rk *reshardKill) waitFinished(t *testing.T, ctx context.Context, mv *taskstorepb.SlotMove) (string, string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var bad []string
		outcome, why := "", ""
		for _, p := range rk.pc.Nodes {
			st := rk.localStatus(ctx, p.ID, 2*time.Second)
			if st == nil {
				bad = append(bad, p.ID+" does not answer")
				continue
			}
			if len(st.Moves) > 0 {
				bad = append(bad, fmt.Sprintf("%s lists moves under way: %v", p.ID, st.Moves))
			}
			found := false
			for _, f := range st.FinishedMoves {
				if f.Id != mv.Id {
					continue
				}
				found = true
				if outcome != "" && f.Phase != outcome {
					t.Fatalf("nodes disagree on how move %d ended: %s and %s", mv.Id, outcome, f.Phase)
				}
				outcome, why = f.Phase, f.Error
			}
			if !found {
				bad = append(bad, fmt.Sprintf("%s does not list move %d finished", p.ID, mv.Id))
			}
		}
		if len(bad) == 0 {
			if outcome != "done" && outcome != "aborted" {
				t.Fatalf("move %d ended %q", mv.Id, outcome)
			}
			return outcome, why
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("moves after the kill: %s", strings.Join(bad, "; "))
		}
		time.Sleep(200 * time.Millisecond)
	}
}
