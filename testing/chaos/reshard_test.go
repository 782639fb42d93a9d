package chaos_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/cluster"
	"github.com/e1158ecb/taskstore/cluster/metapb"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
	"github.com/e1158ecb/taskstore/testing/checker"
	"github.com/e1158ecb/taskstore/testing/workload"
)

// reshardScenario moves the hash slots of the workload's own consistency
// groups between the two shards while the workload runs: four
// rounds (every workload slot of shard A to B; half of them back; the rest
// back; all to B again), and during the first three a kill -9 hits a move
// under way: of the source shard's leader while the source holds the slot
// frozen (the copy runs), of the target shard's leader while it imports
// the slot, and of the meta group's leader, which drives the moves, once a
// move has flipped the routing table. Each killed node is restarted after
// 4 s. A move may end aborted (the slot stays where it was); the routing
// table must then name, for every workload slot, the shard its last move
// left it on, no move may be left under way, every replica of that shard
// must serve the slot and every replica of the other must hold nothing of
// it (gone, or never held).
var reshardScenario = scenario{
	name: reshardName,
	// OP_SLOT needs the shards' state format raised (a second or so after
	// their leaders settle): a move before it would be refused and abandoned.
	before: func(e *env) { e.c.WaitFormat() },
	faults: reshardFaults,
	floor: floor(checker.Floor{checker.CountSlotMoves: 6, checker.CountLeaderChanges: 3,
		checker.CountFaults: 3, checker.FloorUnknown: 1}),
}

// reshardName is the scenario's name and so the workload's group prefix
// (runScenario).
const reshardName = "reshard"

func init() { scenarios = append(scenarios, reshardScenario) }

// resharder moves the workload's slots and keeps count.
type resharder struct {
	e      *env
	ctx    context.Context
	cl     *client.Client
	slots  []uint32            // the workload's slots, in order
	groups map[uint32][]string // slot -> the workload's groups in it
	table  int                 // slots in the routing table
	// want is the shard each workload slot must be on: where the last move
	// of the slot left it (its target if done, its source if aborted).
	want          map[uint32]uint32
	done, aborted int
	kills, hits   int // kills during the rounds; those that hit a move under way
}

func reshardFaults(e *env) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cl := e.dial(ctx)
	r := &resharder{e: e, ctx: ctx, cl: cl, groups: map[uint32][]string{}, want: map[uint32]uint32{}}
	rt := r.routing()
	r.table = len(rt.Slots)
	// The groups runScenario's workload writes to (workload.Config.Group):
	// the zombies' queues are in them too.
	cfg := workload.Defaults
	cfg.Prefix = reshardName
	for g := 0; g < cfg.Groups; g++ {
		name := cfg.Group(g)
		s := uint32(taskstorepb.SlotOf(name, r.table))
		if _, ok := r.groups[s]; !ok {
			r.slots = append(r.slots, s)
		}
		r.groups[s] = append(r.groups[s], name)
		r.want[s] = rt.Slots[s]
	}
	slices.Sort(r.slots)
	shards := e.c.Shards()
	if len(shards) < 2 {
		e.t.Fatalf("the reshard scenario needs 2 shards, the map has %v", shards)
	}
	// A is the shard holding the most workload slots (the lower id on a tie).
	count := map[uint32]int{}
	for _, s := range r.slots {
		count[rt.Slots[s]]++
	}
	a, b := shards[0], shards[1]
	if count[b] > count[a] {
		a, b = b, a
	}
	for _, s := range r.slots {
		e.t.Logf("workload slot %d (groups %v) on shard %d", s, r.groups[s], rt.Slots[s])
	}

	r.round(1, a, b, false, killSource)
	r.round(2, b, a, true, killTarget)
	r.round(3, b, a, false, killMeta)
	r.round(4, a, b, false, killNone)

	r.verify()
	e.t.Logf("slot moves: %d done, %d aborted; %d of %d kills hit a move under way", r.done, r.aborted, r.hits, r.kills)
	if r.hits == 0 {
		e.t.Errorf("no kill hit a move under way: every move had finished before its fault")
	}
}

// Whose leader a round kills.
const (
	killNone   = ""
	killSource = "source"
	killTarget = "target"
	killMeta   = "meta"
)

// routing reads the routing table.
func (r *resharder) routing() *taskstorepb.RoutingResponse {
	r.e.t.Helper()
	rt, err := r.cl.Routing(r.ctx)
	if err != nil {
		r.e.t.Fatalf("routing: %v", err)
	}
	return rt
}

// on lists the workload slots the routing table puts on shard.
func (r *resharder) on(rt *taskstorepb.RoutingResponse, shard uint32) []uint32 {
	var out []uint32
	for _, s := range r.slots {
		if rt.Slots[s] == shard {
			out = append(out, s)
		}
	}
	return out
}

// lastMove is the highest move id the cluster lists (under way or
// finished): the moves a round records come after it.
func (r *resharder) lastMove() uint64 {
	r.e.t.Helper()
	st, err := r.cl.Status(r.ctx, &taskstorepb.StatusRequest{})
	if err != nil {
		r.e.t.Fatalf("status: %v", err)
	}
	var last uint64
	for _, m := range append(slices.Clone(st.Moves), st.FinishedMoves...) {
		last = max(last, m.Id)
	}
	return last
}

// round moves the workload slots on shard from (half of them with half)
// to shard to, kills the leader kill names during the moves, and waits
// until every move of the round ended.
func (r *resharder) round(n int, from, to uint32, half bool, kill string) {
	e := r.e
	e.t.Helper()
	rt := r.routing()
	slots := r.on(rt, from)
	if len(slots) == 0 {
		// Earlier moves were abandoned: move the other way.
		e.t.Logf("round %d: no workload slot on shard %d, moving from shard %d instead", n, from, to)
		from, to = to, from
		if slots = r.on(rt, from); len(slots) == 0 {
			e.t.Fatalf("round %d: no workload slot on either shard: %v", n, rt.Slots)
		}
	}
	if half {
		slots = slots[:max(1, len(slots)/2)]
	}
	switch kill {
	case killSource:
		r.alone(n, from)
	case killTarget:
		r.alone(n, to)
	case killMeta:
		r.alone(n, 0)
	}
	after := r.lastMove()
	e.t.Logf("%s round %d: move slots %v from shard %d to shard %d", time.Now().Format("15:04:05.000"), n, slots, from, to)
	var moves []*taskstorepb.SlotMove
	for deadline := time.Now().Add(30 * time.Second); ; {
		var err error
		if moves, err = r.cl.MoveSlots(r.ctx, slots, to); err == nil {
			break
		}
		// A node restarted by the last round may not answer the version
		// check yet (every node must move slots before a move starts).
		if time.Now().After(deadline) {
			e.t.Fatalf("round %d: move slots: %v", n, err)
		}
		e.t.Logf("round %d: move slots: %v (trying again)", n, err)
		e.sleep(500 * time.Millisecond)
	}
	for _, m := range moves {
		e.t.Logf("round %d: move %d of slot %d, shard %d -> %d, recorded (%s)", n, m.Id, m.Slot, m.From, m.To, m.Phase)
	}
	if kill != killNone {
		r.killDuring(n, kill, from, to, slots, after)
	}
	r.wait(n, from, to, slots, after)
	e.sleep(time.Second) // the workload at the new places
}

// alone hands the leadership of shard to a node that leads neither the
// meta group nor another shard, or with shard 0 the leaderships of every
// shard away from the meta leader, so that the round's kill hits one role
// alone: the slot mover outlives a shard leader's death, or the shards'
// leaders outlive the mover's. Best effort: the leader balancer may hand a
// leadership back within seconds (the fault's line says what the killed
// node led).
func (r *resharder) alone(n int, shard uint32) {
	e := r.e
	e.t.Helper()
	meta := e.c.MetaLeader()
	for end := time.Now().Add(30 * time.Second); meta < 0 && time.Now().Before(end); meta = e.c.MetaLeader() {
		e.sleep(50 * time.Millisecond)
	}
	if meta < 0 {
		e.t.Fatalf("round %d: the meta group has no leader", n)
	}
	busy := map[int]bool{meta: true} // nodes the handed leadership must avoid
	var moving []uint32
	if shard == 0 {
		for _, s := range e.c.Shards() {
			if e.leader(s) == meta {
				moving = append(moving, s)
			}
		}
	} else {
		for _, s := range e.c.Shards() {
			if s != shard {
				busy[e.leader(s)] = true
			}
		}
		if busy[e.leader(shard)] {
			moving = append(moving, shard)
		}
	}
	for _, s := range moving {
		to := -1
		for i := range e.c.Nodes {
			if e.c.Running(i) && !busy[i] && i != e.c.Leader(s) {
				to = i
				break
			}
		}
		if to < 0 {
			e.t.Logf("round %d: no node to hand shard %d's leadership to", n, s)
			continue
		}
		e.fault("round %d: transfer the leadership of shard %d from %s to %s, so that the kill hits one role alone",
			n, s, e.c.Nodes[e.c.Leader(s)].ID, e.c.Nodes[to].ID)
		if err := e.c.TransferLeader(s, to); err != nil {
			e.t.Logf("round %d: transfer: %v", n, err)
		}
		for end := time.Now().Add(10 * time.Second); e.c.Leader(s) != to && time.Now().Before(end); {
			e.sleep(20 * time.Millisecond)
		}
		e.leader(s)
	}
}

// killDuring kills -9 the leader kill names as soon as a move of the round
// reaches the point the fault is meant for (polled every millisecond), and
// restarts it 4 s later. If every move ended first, it kills the leader
// anyway and says so.
func (r *resharder) killDuring(n int, kill string, from, to uint32, slots []uint32, after uint64) {
	e := r.e
	e.t.Helper()
	ours := func(id uint64, slot uint32) bool { return id > after && slices.Contains(slots, slot) }
	// slotIn returns the leader of shard when its replica holds one of the
	// round's slots in phase for the slot's move, else -1.
	slotIn := func(shard uint32, phase fsmpb.SlotState_Phase) (int, string) {
		l := e.c.Leader(shard)
		if l < 0 {
			return -1, ""
		}
		states, _ := e.c.SlotStates(l, shard)
		for _, ss := range states {
			if ss.Phase == phase && ours(ss.Move, ss.Slot) {
				return l, fmt.Sprintf("shard %d holds slot %d %v for move %d", shard, ss.Slot, ss.Phase, ss.Move)
			}
		}
		return -1, ""
	}
	var at func() (int, string)
	var role string
	switch kill {
	case killSource:
		role = fmt.Sprintf("leader of shard %d, the moves' source", from)
		at = func() (int, string) { return slotIn(from, fsmpb.SlotState_FROZEN) }
	case killTarget:
		role = fmt.Sprintf("leader of shard %d, the moves' target", to)
		at = func() (int, string) { return slotIn(to, fsmpb.SlotState_IMPORTING) }
	case killMeta:
		role = "leader of the meta group, which drives the moves"
		at = func() (int, string) {
			for _, m := range e.c.MetaMap().GetMoves() {
				if ours(m.Id, m.Slot) && m.Phase == metapb.SlotMove_FLIPPED {
					if l := e.c.MetaLeader(); l >= 0 {
						return l, fmt.Sprintf("move %d of slot %d has flipped the routing table", m.Id, m.Slot)
					}
				}
			}
			return -1, ""
		}
	}
	underWay := func() bool {
		for _, m := range e.c.MetaMap().GetMoves() {
			if ours(m.Id, m.Slot) {
				return true
			}
		}
		return false
	}
	victim, why := -1, ""
	for deadline := time.Now().Add(20 * time.Second); victim < 0 && time.Now().Before(deadline) && underWay(); {
		if victim, why = at(); victim < 0 {
			time.Sleep(time.Millisecond)
		}
	}
	moving := r.movesUnderWay(ours)
	r.kills++
	if victim >= 0 {
		r.hits++
	} else {
		why = "missed: the moves had ended (or never got there)"
		switch kill {
		case killSource:
			victim = e.leader(from)
		case killTarget:
			victim = e.leader(to)
		case killMeta:
			for victim = e.c.MetaLeader(); victim < 0; victim = e.c.MetaLeader() {
				e.sleep(50 * time.Millisecond)
			}
		}
	}
	e.fault("round %d: kill -9 %s, %s%s, during the moves (%s; under way: %s)", n, e.c.Nodes[victim].ID, role, r.alsoLeads(victim), why, moving)
	e.c.Kill(victim)
	e.sleep(4 * time.Second)
	e.t.Logf("round %d: restart %s; under way: %s", n, e.c.Nodes[victim].ID, r.movesUnderWay(ours))
	e.c.Restart(victim)
}

// alsoLeads names what else node i leads (shards, the meta group).
func (r *resharder) alsoLeads(i int) string {
	var what []string
	for _, s := range r.e.c.Shards() {
		if r.e.c.Leader(s) == i {
			what = append(what, fmt.Sprintf("shard %d", s))
		}
	}
	if r.e.c.MetaLeader() == i {
		what = append(what, "meta")
	}
	if len(what) == 0 {
		return ""
	}
	return " (leads " + strings.Join(what, ", ") + ")"
}

// movesUnderWay describes the round's moves in the most current map.
func (r *resharder) movesUnderWay(ours func(uint64, uint32) bool) string {
	var out []string
	for _, m := range r.e.c.MetaMap().GetMoves() {
		if ours(m.Id, m.Slot) {
			out = append(out, fmt.Sprintf("move %d slot %d %d->%d %s", m.Id, m.Slot, m.From, m.To, cluster.MovePhaseName(m.Phase)))
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

// wait waits until every slot of the round has a finished move after
// after, counts how each ended and records where it left the slot.
func (r *resharder) wait(n int, from, to uint32, slots []uint32, after uint64) {
	e := r.e
	e.t.Helper()
	start := time.Now()
	deadline := start.Add(2*cluster.MoveCopyTimeout + 30*time.Second)
	for {
		st, err := r.cl.Status(r.ctx, &taskstorepb.StatusRequest{})
		if err == nil {
			ended := map[uint32]*taskstorepb.SlotMove{}
			for _, m := range st.FinishedMoves {
				if m.Id > after && slices.Contains(slots, m.Slot) {
					ended[m.Slot] = m
				}
			}
			if len(ended) == len(slots) {
				for _, s := range slots {
					m := ended[s]
					if m.From != from || m.To != to {
						e.t.Errorf("round %d: move %d of slot %d went from shard %d to %d, asked %d to %d", n, m.Id, s, m.From, m.To, from, to)
					}
					switch m.Phase {
					case "done":
						r.done++
						r.want[s] = m.To
						e.h.Count(checker.CountSlotMoves, 1)
						e.t.Logf("round %d: move %d of slot %d done: on shard %d", n, m.Id, s, m.To)
					case "aborted":
						r.aborted++
						r.want[s] = m.From
						e.t.Logf("round %d: move %d of slot %d ABORTED, the slot stays on shard %d: %s", n, m.Id, s, m.From, m.Error)
					default:
						e.t.Errorf("round %d: move %d of slot %d finished in phase %q", n, m.Id, s, m.Phase)
					}
				}
				e.t.Logf("round %d: every move ended %v after the wait began", n, time.Since(start).Round(time.Millisecond))
				return
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("round %d: moves of slots %v not finished after %v (status: %v; under way: %v)", n, slots, time.Since(start).Round(time.Second), err, st.GetMoves())
		}
		e.sleep(100 * time.Millisecond)
	}
}

// verify checks the end of the moves: no move under way and the routing
// table naming, for each workload slot, the shard its last move left it on
// (through the API and in every node's map); every replica of that shard
// serves the slot, every replica of the other shard holds nothing of it
// and refuses it (gone, or never held).
func (r *resharder) verify() {
	e := r.e
	e.t.Helper()
	st, err := r.cl.Status(r.ctx, &taskstorepb.StatusRequest{})
	if err != nil {
		e.t.Fatalf("status: %v", err)
	}
	if len(st.Moves) != 0 {
		e.t.Errorf("moves still under way after every round ended: %v", st.Moves)
	}
	rt := r.routing()
	for _, s := range r.slots {
		if rt.Slots[s] != r.want[s] {
			e.t.Errorf("the routing table puts workload slot %d (groups %v) on shard %d; its last move left it on shard %d", s, r.groups[s], rt.Slots[s], r.want[s])
		}
	}
	// The nodes' own copies of the map and the replicas' slot states:
	// followers apply the last steps a moment later.
	var problems []string
	for deadline := time.Now().Add(30 * time.Second); ; {
		problems = r.replicaProblems()
		if len(problems) == 0 || time.Now().After(deadline) {
			break
		}
		e.sleep(200 * time.Millisecond)
	}
	for _, p := range problems {
		e.t.Errorf("after the moves: %s", p)
	}
}

// replicaProblems lists what disagrees with r.want in the nodes' maps and
// the replicas' slot states.
func (r *resharder) replicaProblems() []string {
	e := r.e
	var out []string
	for i, node := range e.c.Nodes {
		if !e.c.Running(i) {
			out = append(out, fmt.Sprintf("%s is not running", node.ID))
			continue
		}
		cm := node.Server().Node.Map()
		if len(cm.Slots) != r.table {
			// A restarted node replays its copy of the map a moment later.
			out = append(out, fmt.Sprintf("%s's map has %d slots, want %d", node.ID, len(cm.Slots), r.table))
			continue
		}
		if len(cm.Moves) != 0 {
			out = append(out, fmt.Sprintf("%s's map lists %d moves under way", node.ID, len(cm.Moves)))
		}
		for _, s := range r.slots {
			if cm.Slots[s] != r.want[s] {
				out = append(out, fmt.Sprintf("%s's map puts slot %d on shard %d, want %d", node.ID, s, cm.Slots[s], r.want[s]))
			}
		}
		for _, sh := range e.c.Shards() {
			states, ok := e.c.SlotStates(i, sh)
			if !ok {
				continue
			}
			tasks, _ := e.c.SlotTasks(i, sh, r.table)
			for _, s := range r.slots {
				var ss *fsmpb.SlotState
				for _, x := range states {
					if x.Slot == s {
						ss = x
					}
				}
				if sh == r.want[s] {
					if ss != nil {
						out = append(out, fmt.Sprintf("%s: shard %d serves slot %d by the table but its replica holds it %v (move %d)", node.ID, sh, s, ss.Phase, ss.Move))
					}
					continue
				}
				if ss != nil && ss.Phase != fsmpb.SlotState_GONE {
					out = append(out, fmt.Sprintf("%s: shard %d does not serve slot %d by the table but its replica holds it %v (move %d)", node.ID, sh, s, ss.Phase, ss.Move))
				}
				if tasks[s] != 0 {
					out = append(out, fmt.Sprintf("%s: shard %d does not serve slot %d by the table but its replica holds %d of its tasks", node.ID, sh, s, tasks[s]))
				}
			}
		}
	}
	return out
}
