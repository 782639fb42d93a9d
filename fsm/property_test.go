package fsm

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// TestProperty runs random command sequences against the Machine and the
// reference model and requires identical results and state; a second
// machine restored from a snapshot taken midway, fed the rest of the log
// through Apply, must end with the same digest.
func TestProperty(t *testing.T) {
	const seeds, steps = 40, 600
	seen := map[string]int{}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			propertyRun(t, seed, steps, seen, memMachine)
		})
	}
	// The generator must reach every outcome, or the comparison proves
	// little.
	want := []string{"modify", "claim", "claim-empty", "purge", "batch", "stale-seq", "coalesced", "moved",
		"modify-claim", "modify-claim-empty", "modify-claim-group", "modify-claim-refused", "id-in-two-groups",
		"was-paused", "claim-in-paused", "claim-at-limit", "held-insert", "reserved-key",
		"schedule-replaced", "schedule-elsewhere", "fired-insert", "fired-taken", "claim-read-empty", "dead-lettered", "expired"}
	for c := range fsmpb.RefError_Category_value {
		if c != "CATEGORY_UNSPECIFIED" {
			want = append(want, c)
		}
	}
	for _, k := range want {
		if seen[k] < 3 {
			t.Errorf("outcome %s seen %d times", k, seen[k])
		}
	}
	t.Logf("outcomes: %v", seen)
}

func countOutcomes(seen map[string]int, res *fsmpb.Result) {
	switch {
	case res.Failure != nil && res.Failure.Message == StaleSequenceMessage:
		seen["stale-seq"]++
	case res.Failure != nil && strings.HasPrefix(res.Failure.Message, "claim.queues"):
		seen["modify-claim-group"]++
	case res.Failure != nil && strings.HasPrefix(res.Failure.Message, ScheduleElsewhere):
		seen["schedule-elsewhere"]++
	case res.Failure != nil:
		for _, e := range res.Failure.Errors {
			seen[e.Category.String()]++
		}
	case res.Modify != nil:
		seen["modify"]++
		if len(res.Modify.Coalesced) > 0 {
			seen["coalesced"]++
		}
		switch c := res.Modify.Claim; {
		case c == nil:
		case len(c.Tasks) > 0:
			seen["modify-claim"]++
		default:
			seen["modify-claim-empty"]++
		}
	case res.Claim != nil && len(res.Claim.Tasks) == 0:
		seen["claim-empty"]++
	case res.Claim != nil:
		seen["claim"]++
	case res.Purge != nil && res.Purge.Deleted > 0:
		seen["purge"]++
	case res.Pause != nil && res.Pause.WasPaused:
		seen["was-paused"]++
	case res.Schedule != nil && res.Schedule.Existed:
		seen["schedule-replaced"]++
	case res.Batch != nil:
		seen["batch"]++
		for _, sub := range res.Batch {
			countOutcomes(seen, sub)
		}
	}
}

// TestPropertyOnDisk runs the property test on the on-disk store: the same
// applier, the same model, fewer seeds (each step is a Pebble batch).
func TestPropertyOnDisk(t *testing.T) {
	const seeds, steps = 40, 600
	seen := map[string]int{}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			propertyRun(t, 1000+seed, steps, seen, diskMachine)
		})
	}
	t.Logf("outcomes: %v", seen)
}

func propertyRun(t *testing.T, seed uint64, steps int, seen map[string]int, newMachine func(testing.TB, Options) *Machine) {
	const maxSessions, ttl = 3, 200
	opts := Options{MaxSessions: maxSessions, SessionTTL: ttl}
	m := newMachine(t, opts)
	ref := newRefModel(maxSessions, ttl)
	g := &gen{r: rand.New(rand.NewPCG(seed, 7)), ref: ref, now: 1000, seqs: map[string]uint64{},
		queues: []string{"g/a", "g/b", "g", "h/a"}, clients: []string{"c1", "c2", "c3", "c4"}}
	var replica *Machine
	for i := 1; i <= steps; i++ {
		cmd := g.command(true)
		data, err := EncodeCommand(cmd)
		if err != nil {
			t.Fatal(err)
		}
		// The leader answers a claim empty without proposing it when the
		// machine says it would find nothing: whenever it says so, the
		// claim applied at that time must claim nothing, replay nothing
		// and be refused for nothing.
		readEmpty := cmd.Op == fsmpb.Op_OP_CLAIM && m.ClaimFindsNothing(cmd, cmd.Now)
		got := m.Apply(&raft.Log{Index: uint64(i), Type: raft.LogCommand, Data: data}).(*fsmpb.Result)
		if readEmpty {
			if !proto.Equal(got, &fsmpb.Result{Claim: &fsmpb.ClaimResult{}}) {
				t.Fatalf("step %d: %v: ClaimFindsNothing said nothing, the claim answered %v", i, cmd, got)
			}
			seen["claim-read-empty"]++
		} else if cmd.Op == fsmpb.Op_OP_CLAIM && emptyClaim(got) && !got.Replayed {
			seen["claim-proposed-empty"]++ // in doubt: proposed, found nothing
		}
		want := ref.apply(cmd)
		if !proto.Equal(got, want) {
			t.Fatalf("step %d: %v\ngot  %v\nwant %v", i, cmd, got, want)
		}
		countOutcomes(seen, got)
		if c := cmd.GetClaim(); c != nil {
			for _, q := range c.Queues {
				if ref.paused[q] && len(ref.Queues(q)) > 0 {
					seen["claim-in-paused"]++ // a claim of a paused queue with tasks
				}
				if l := ref.limits[q]; l > 0 && !ref.paused[q] && ref.claimedIn(q) == int(l) && len(ref.Queues(q)) > 0 {
					seen["claim-at-limit"]++ // the limit holds tasks back
				}
			}
		}
		if f := cmd.GetFire(); f != nil && f.Insert && f.Next > f.Tick {
			if got.Modify != nil {
				seen["fired-insert"]++
			} else if ref.schedules[refGroup(f.Queue)+"\x00"+f.Name].GetLast() == f.Tick {
				seen["fired-taken"]++ // the tick's id was taken: nothing inserted twice
			}
		}
		if cmd.GetModify().GetClaim() != nil && len(got.GetFailure().GetErrors()) > 0 {
			seen["modify-claim-refused"]++ // the transaction failed: nothing claimed
		}
		if got.Modify != nil {
			for _, in := range got.Modify.Inserted {
				if in.Claimant != "" && in.Version == 1 {
					seen["held-insert"]++
				}
				for _, other := range ref.tasks {
					if other.Id == in.Id && refGroup(other.Queue) != refGroup(in.Queue) {
						seen["id-in-two-groups"]++ // FormatGroupIDs at work
						break
					}
				}
			}
			for _, ch := range cmd.GetModify().GetChanges() {
				if ch.Queue != "" {
					seen["moved"]++ // a successful change naming a queue
				}
			}
		}
		if replica != nil {
			replica.Apply(&raft.Log{Index: uint64(i), Type: raft.LogCommand, Data: data})
		}
		if i == steps/2 {
			snap, err := m.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := snap.(*snapshot).writeTo(&buf); err != nil {
				t.Fatal(err)
			}
			replica = newMachine(t, opts)
			if err := replica.Restore(nopCloser{&buf}); err != nil {
				t.Fatal(err)
			}
		}
		if i%25 == 0 || i == steps {
			compareState(t, i, m, ref)
		}
	}
	seen["reserved-key"] += ref.reservedHit
	seen["dead-lettered"] += ref.deadLetters
	seen["expired"] += ref.expired
	if m.Digest() != replica.Digest() {
		t.Fatalf("restored replica's digest differs")
	}
	if !bytes.Equal(persist(t, m), persist(t, replica)) {
		t.Fatalf("snapshots of equal states differ")
	}
	if m.AppliedIndex() != uint64(steps) || replica.AppliedIndex() != uint64(steps) {
		t.Fatalf("applied index %d and %d, want %d", m.AppliedIndex(), replica.AppliedIndex(), steps)
	}
}

func compareState(t *testing.T, step int, m *Machine, ref *refModel) {
	t.Helper()
	if m.Clock() != ref.clock {
		t.Fatalf("step %d: clock %d, want %d", step, m.Clock(), ref.clock)
	}
	got := allTasks(m)
	var want []*fsmpb.Task
	for _, tk := range ref.tasks {
		want = append(want, tk)
	}
	slices.SortFunc(want, func(a, b *fsmpb.Task) int {
		if c := strings.Compare(a.Id, b.Id); c != 0 {
			return c
		}
		return strings.Compare(a.Queue, b.Queue)
	})
	if len(got) != len(want) {
		t.Fatalf("step %d: %d tasks, want %d", step, len(got), len(want))
	}
	for i := range got {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("step %d: task\n%v\nwant\n%v", step, got[i], want[i])
		}
	}
	sameStats := func(a, b QueueStats) bool {
		pa, pb := a.Policy, b.Policy
		a.Policy, b.Policy = nil, nil
		return a == b && proto.Equal(pa, pb)
	}
	if gq, wq := m.Queues("", 0), ref.queueStats(); !slices.EqualFunc(gq, wq, sameStats) {
		t.Fatalf("step %d: queues\n%+v\nwant\n%+v", step, gq, wq)
	}
	gs := m.Schedules("")
	ws := slices.SortedFunc(maps.Values(ref.schedules), func(a, b *fsmpb.Schedule) int {
		return cmp.Or(strings.Compare(a.Queue, b.Queue), strings.Compare(a.Name, b.Name))
	})
	if len(gs) != len(ws) {
		t.Fatalf("step %d: %d schedules, want %d", step, len(gs), len(ws))
	}
	for i := range gs {
		if !proto.Equal(gs[i], ws[i]) {
			t.Fatalf("step %d: schedule\n%v\nwant\n%v", step, gs[i], ws[i])
		}
	}
	// List in claim order, one task per page, matches a sort.
	for _, q := range []string{"g/a", "g", "h/a"} {
		var listed []*fsmpb.Task
		token := ""
		for {
			page, next, err := m.List(q, token, 1, nil, false)
			if err != nil {
				t.Fatal(err)
			}
			listed = append(listed, page...)
			if next == "" {
				break
			}
			if len(listed) > len(ref.tasks) {
				t.Fatalf("step %d: list %s does not end", step, q)
			}
			token = next
		}
		var wantQ []*fsmpb.Task
		nextAt, any := int64(0), false
		for _, tk := range ref.tasks {
			if tk.Queue == q {
				wantQ = append(wantQ, tk)
				full := ref.limits[q] > 0 && ref.claimedIn(q) >= int(ref.limits[q])
				at := max(tk.At, ref.tokenAt(q)) // nothing before a token (a rate)
				if !ref.paused[q] && !full && (!any || at < nextAt) {
					nextAt, any = at, true
				}
			}
		}
		slices.SortFunc(wantQ, refClaimLess)
		if len(listed) != len(wantQ) {
			t.Fatalf("step %d: list %s: %d tasks, want %d", step, q, len(listed), len(wantQ))
		}
		for i := range listed {
			if !proto.Equal(listed[i], wantQ[i]) {
				t.Fatalf("step %d: list %s[%d] = %v, want %v", step, q, i, listed[i], wantQ[i])
			}
		}
		if at, ok := m.NextAt([]string{q}); at != nextAt || ok != any {
			t.Fatalf("step %d: NextAt(%s) = %d, %v; want %d, %v", step, q, at, ok, nextAt, any)
		}
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	st := m.st.store
	if n := st.reservationCount(); n != len(ref.reserved) {
		t.Fatalf("step %d: %d key reservations, want %d", step, n, len(ref.reserved))
	}
	for k, want := range ref.reserved {
		got := st.reservation(k[0], k[1])
		if got == nil || got.until != want.until || !proto.Equal(got.last.toProto(false), want.last) {
			t.Fatalf("step %d: reservation of %v: %+v, want %+v", step, k, got, want)
		}
	}
	if n := st.sessionCount(); n != len(ref.sessions) {
		t.Fatalf("step %d: %d sessions, want %d", step, n, len(ref.sessions))
	}
	for id, s := range ref.sessions {
		ms := st.session(id)
		if ms == nil || ms.seq != s.seq || ms.lastSeen != s.lastSeen || !proto.Equal(ms.answer(), s.result) {
			t.Fatalf("step %d: session %s differs", step, id)
		}
	}
	due := 0
	for _, tk := range ref.tasks {
		if tk.At > ref.clock {
			due++
		}
	}
	counted := 0
	st.ascendQueues("", func(q *queue) bool {
		counted += int(q.futureClaimed + q.futureDelayed)
		return true
	})
	if counted != due {
		t.Fatalf("step %d: the queues count %d tasks due later, want %d", step, counted, due)
	}
	if ms, ok := st.(*memStore); ok {
		// The in-memory store's indexes agree with its maps.
		if ms.reservedOrder.Len() != len(ms.reserved) || ms.sessionOrder.Len() != len(ms.sessions) || ms.pending.Len() != due {
			t.Fatalf("step %d: the in-memory indexes are out of step", step)
		}
	}
}
