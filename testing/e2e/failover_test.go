package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// failoverWriter inserts into one queue. A parallel one sends an insert
// every interval, each in its own goroutine, so that an insert stuck on
// the dead leader does not hold back the ones after it: the first insert
// acknowledged after a kill is then the first the cluster could take. A
// serial one sends the next insert when the last returned, as a program
// that waits for each write does: its gap adds what the client's retries
// and backoff cost.
type failoverWriter struct {
	name   string
	cl     *client.Client
	serial bool
	mu     sync.Mutex
	acks   []failoverAck
}

type failoverAck struct{ sent, acked time.Time }

func (w *failoverWriter) run(ctx context.Context, queue string, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if w.serial {
			w.insert(ctx, queue, i)
			continue
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			w.insert(ctx, queue, i)
		}(i)
	}
}

func (w *failoverWriter) insert(ctx context.Context, queue string, i int) {
	ictx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	sent := time.Now()
	if _, err := w.cl.Insert(ictx, queue, []byte("x"), client.WithID(fmt.Sprintf("%s-%d", w.name, i))); err != nil {
		return
	}
	w.mu.Lock()
	w.acks = append(w.acks, failoverAck{sent: sent, acked: time.Now()})
	w.mu.Unlock()
}

// gap is the time from killed to the first acknowledgement of an insert
// sent at or after it; ok is false when none was acknowledged yet.
func (w *failoverWriter) gap(killed time.Time) (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var first time.Time
	for _, a := range w.acks {
		if !a.sent.Before(killed) && (first.IsZero() || a.acked.Before(first)) {
			first = a.acked
		}
	}
	return first.Sub(killed), !first.IsZero()
}

// TestFailoverWriteGap kills the leader of a written shard with SIGKILL 20
// times (restarting it each time) while four writers insert, two with the
// Go client straight to the nodes and two through a taskproxy, one of each
// sending every 20 ms and one waiting for each insert, and reports each
// one's write gap: from the kill to the first acknowledged insert sent
// after it. Default flags; TASKSTORE_FAILOVER_FLAGS adds node flags and
// TASKSTORE_FAILOVER_KILLS changes the count:
//
//	make test-failover
//	TASKSTORE_FAILOVER_FLAGS='--raft-timeout-scale 2' go test -run TestFailoverWriteGap -v ./testing/e2e/
//
// In the full suite it kills 5 times and fails only when writes do not
// come back (a minute per kill): a timed assertion would fail on a
// starved machine, not on a slow fail-over. make test-failover
// (TASKSTORE_FAILOVER_TARGETS=1) kills 20 times and, at default flags,
// asserts the targets: the median (p50 <= 2 s; 1.2-1.3 s measured on a
// loaded machine, 2.6 s before followers noticed a dead leader by its
// refused connections, 3.9 s with the old 1.5 s heartbeat timeout) and,
// for the max (target 4 s), a loaded machine's margin: every gap within
// 6 s.
func TestFailoverWriteGap(t *testing.T) {
	if testing.Short() {
		t.Skip("kills of real processes: a few minutes (make test-failover)")
	}
	targets := os.Getenv("TASKSTORE_FAILOVER_TARGETS") == "1"
	kills := 5
	if targets {
		kills = 20
	}
	if v := os.Getenv("TASKSTORE_FAILOVER_KILLS"); v != "" {
		var err error
		if kills, err = strconv.Atoi(v); err != nil || kills < 1 {
			t.Fatalf("TASKSTORE_FAILOVER_KILLS=%q: want a positive count", v)
		}
	}
	flags := strings.Fields(os.Getenv("TASKSTORE_FAILOVER_FLAGS"))
	pc := harness.StartProcesses(t, 3, flags...)
	pc.WaitReady(90 * time.Second)
	px := pc.StartProxy("proxy")
	for end := time.Now().Add(60 * time.Second); !px.Ready(); {
		if time.Now().After(end) {
			t.Fatal("proxy not ready")
		}
		time.Sleep(100 * time.Millisecond)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin := pc.Dial(ctx)
	proxied, err := client.Dial(ctx, px.Addr, client.WithProxyOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer proxied.Close()
	const group = "failover"
	queue := group + "/q"
	directCl := pc.Dial(ctx)
	writers := []*failoverWriter{
		{name: "direct", cl: directCl},
		{name: "proxy", cl: proxied},
		{name: "direct-serial", cl: directCl, serial: true},
		{name: "proxy-serial", cl: proxied, serial: true},
	}
	// Both writers work before the first kill: the direct client has its
	// routing table and the proxy its connections.
	if _, err := directCl.Insert(ctx, queue, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := proxied.Insert(ctx, queue, []byte("x")); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wctx, stopWriters := context.WithCancel(ctx)
	for _, w := range writers {
		wg.Add(1)
		go func() { defer wg.Done(); w.run(wctx, queue, 20*time.Millisecond) }()
	}
	defer func() { stopWriters(); wg.Wait() }()

	leaderOf := func() (string, error) {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		rt, err := admin.Routing(rctx)
		if err != nil {
			return "", err
		}
		shard := rt.Slots[taskstorepb.SlotOf(group, len(rt.Slots))]
		for _, s := range rt.Shards {
			if s.Id == shard {
				return s.LeaderId, nil
			}
		}
		return "", fmt.Errorf("shard %d not in the routing table", shard)
	}
	gaps := make([][]time.Duration, len(writers))
	for r, missed := 0, 0; r < kills; r++ {
		// A leader that every replica follows and a restarted node that
		// is ready: the kill is the only fault.
		var victim *harness.Process
		for end := time.Now().Add(time.Minute); victim == nil; time.Sleep(200 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("round %d: no leader of group %q's shard for a minute", r, group)
			}
			if id, err := leaderOf(); err == nil && id != "" {
				victim = pc.Node(id)
			}
		}
		killed := time.Now()
		victim.Kill()
		got := make([]string, len(writers))
		this := make([]time.Duration, len(writers))
		for i, w := range writers {
			for {
				if g, ok := w.gap(killed); ok {
					got[i] = fmt.Sprintf("%s %v", w.name, g.Round(time.Millisecond))
					this[i] = g
					break
				}
				if time.Since(killed) > time.Minute {
					t.Fatalf("round %d: no %s insert acknowledged within a minute of killing %s", r, w.name, victim.ID)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		// Followers wait at least the leader lease (0.5 s at default
		// flags) before they elect: writes that went on sooner mean the
		// victim had handed its leadership on (balancing) before the
		// kill. Such a round is not a fail-over; it is done again.
		if slices.Min(this) < 250*time.Millisecond && missed < kills {
			missed++
			t.Logf("round %d: killed %s, but writes went on (%s): it no longer led; not counted", r, victim.ID, strings.Join(got, ", "))
			r--
		} else {
			for i, g := range this {
				gaps[i] = append(gaps[i], g)
			}
			t.Logf("round %d: killed %s, write gap %s", r, victim.ID, strings.Join(got, ", "))
		}
		if err := victim.Start(); err != nil {
			t.Fatal(err)
		}
		pc.WaitReady(time.Minute)
		// Let the restarted node catch up and leadership balancing
		// settle, so that the next kill meets a steady cluster.
		time.Sleep(3 * time.Second)
	}
	stopWriters()
	wg.Wait()
	var worst time.Duration
	for i, w := range writers {
		name := w.name
		g := slices.Clone(gaps[i])
		slices.Sort(g)
		p50, mx := g[len(g)/2], g[len(g)-1]
		t.Logf("MEASURE failover write gap %s flags=%q kills=%d: p50 %v max %v min %v", name, strings.Join(flags, " "), len(g),
			p50.Round(time.Millisecond), mx.Round(time.Millisecond), g[0].Round(time.Millisecond))
		if targets && len(flags) == 0 && p50 > 2*time.Second {
			t.Errorf("%s: p50 write gap %v, want <= 2 s", name, p50)
		}
		worst = max(worst, mx)
	}
	if targets && len(flags) == 0 && worst > 6*time.Second {
		t.Errorf("max write gap %v, want <= 4 s (6 s with a loaded machine's margin)", worst)
	}
}
