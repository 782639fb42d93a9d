package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestMeasureSlotMovePause prints the pause a slot's writers see while the
// slot moves (p99 < 1 s for a slot of 10,000 tasks), beside the
// latency of writers of another slot of the same shard, which should see
// none. Real taskstored processes; it measures, it does not judge
// (TASKSTORE_MEASURE_TASKS=100000 for a larger slot):
//
//	TASKSTORE_MEASURE=1 go test -run MeasureSlotMovePause -v ./testing/e2e/
func TestMeasureSlotMovePause(t *testing.T) {
	if os.Getenv("TASKSTORE_MEASURE") == "" {
		t.Skip("set TASKSTORE_MEASURE=1 to measure")
	}
	pc := harness.StartProcesses(t, 3, "--shards", "2")
	pc.WaitReady(60 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cl := pc.Dial(ctx)
	rt, err := cl.Routing(ctx)
	if err != nil {
		t.Fatal(err)
	}
	group := func(prefix string, skip int) (string, uint32) {
		for i := 0; ; i++ {
			g := fmt.Sprintf("%s%d", prefix, i)
			s := taskstorepb.SlotOf(g, len(rt.Slots))
			if rt.Slots[s] == 1 && s != skip {
				return g, uint32(s)
			}
		}
	}
	moving, slot := group("big", -1)
	other, _ := group("calm", int(slot))

	tasks := 10000 // TASKSTORE_MEASURE_TASKS sets another count
	if v, err := strconv.Atoi(os.Getenv("TASKSTORE_MEASURE_TASKS")); err == nil && v > 0 {
		tasks = v
	}
	for b := 0; b < tasks/500; b++ {
		req := &taskstorepb.ModifyRequest{}
		for i := 0; i < 500; i++ {
			req.Inserts = append(req.Inserts, &taskstorepb.TaskInsert{Id: fmt.Sprintf("p%d-%d", b, i), Queue: moving + "/q", Value: make([]byte, 64)})
		}
		if _, err := cl.Modify(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	// The format of the shards is raised by now (the inserts went through).
	var (
		stop atomic.Bool
		wg   sync.WaitGroup
		mu   sync.Mutex
		lat  = map[string][]time.Duration{}
	)
	writer := func(g string, w int) {
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			start := time.Now()
			_, err := cl.Insert(ctx, g+"/live", make([]byte, 64), client.WithID(fmt.Sprintf("w%d-%d", w, i)))
			d := time.Since(start)
			if err != nil {
				t.Errorf("insert into %s: %v", g, err)
				return
			}
			mu.Lock()
			lat[g] = append(lat[g], d)
			mu.Unlock()
		}
	}
	for w := 0; w < 4; w++ {
		wg.Add(2)
		go writer(moving, w)
		go writer(other, 100+w)
	}
	time.Sleep(2 * time.Second)
	mu.Lock()
	before := map[string]int{moving: len(lat[moving]), other: len(lat[other])}
	mu.Unlock()
	start := time.Now()
	moves, err := cl.MoveSlots(ctx, []uint32{slot}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.WaitMoves(ctx, moves, nil); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	time.Sleep(2 * time.Second)
	stop.Store(true)
	wg.Wait()
	report := func(name string, ds []time.Duration) {
		slices.Sort(ds)
		if len(ds) == 0 {
			t.Logf("%s: no writes", name)
			return
		}
		t.Logf("%s: %d writes, p50 %v p99 %v max %v", name, len(ds), ds[len(ds)/2], ds[len(ds)*99/100], ds[len(ds)-1])
	}
	t.Logf("move of slot %d (%d tasks of 64 bytes) from shard 1 to 2: %v from the request to the end", slot, tasks, took.Round(time.Millisecond))
	mu.Lock()
	defer mu.Unlock()
	report("writers of the moving slot, before the move", slices.Clone(lat[moving][:before[moving]]))
	report("writers of the moving slot, from the move on", slices.Clone(lat[moving][before[moving]:]))
	report("writers of another slot of shard 1, before", slices.Clone(lat[other][:before[other]]))
	report("writers of another slot of shard 1, from the move on", slices.Clone(lat[other][before[other]:]))
	var worst time.Duration
	for _, d := range lat[moving][before[moving]:] {
		worst = max(worst, d)
	}
	t.Logf("the moving slot's writers' pause: longest write %v", worst)
}
