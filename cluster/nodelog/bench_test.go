package nodelog

import (
	"fmt"
	"sync"
	"testing"

	"github.com/hashicorp/raft"
)

// BenchmarkAppend is one group's appends of one 200-byte entry each, every
// one waiting for its fdatasync: the floor of a lone shard's commit.
func BenchmarkAppend(b *testing.B) {
	l, err := Open(b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	g := l.Group(1)
	data := make([]byte, 200)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := g.StoreLog(&raft.Log{Index: uint64(i + 1), Term: 1, Data: data}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAppendEightGroups is eight groups appending at once, each
// waiting for its own fdatasync: what group commit shares.
func BenchmarkAppendEightGroups(b *testing.B) {
	var syncs int
	l, err := Open(b.TempDir(), Options{OnSync: func(e, _ int) {
		if e > 0 {
			syncs++
		}
	}})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	data := make([]byte, 200)
	b.ResetTimer()
	var wg sync.WaitGroup
	for g := uint32(1); g <= 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < b.N/8+1; i++ {
				if err := l.Group(g).StoreLog(&raft.Log{Index: uint64(i + 1), Term: 1, Data: data}); err != nil {
					panic(fmt.Sprint(err))
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(8*(b.N/8+1))/float64(syncs), "entries/sync")
}
