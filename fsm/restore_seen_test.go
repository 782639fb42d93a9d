package fsm

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"testing"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// lookupCounter is a store on disk that counts the duplicate checks a
// restore asks it (reads of the engine by id or by key).
type lookupCounter struct {
	*diskStore
	lookups int
}

func (c *lookupCounter) find(group, id string) *task {
	c.lookups++
	return c.diskStore.find(group, id)
}

func (c *lookupCounter) holds(id string) bool {
	c.lookups++
	return c.diskStore.holds(id)
}

func (c *lookupCounter) keyOwner(queue, key string) string {
	c.lookups++
	return c.diskStore.keyOwner(queue, key)
}

// installCounted reads stream into an empty range of a store on disk and
// returns the state and the duplicate checks the store was asked.
func installCounted(t *testing.T, stream []byte) (*state, int, error) {
	t.Helper()
	d := diskMachine(t, Options{}).st.store.(*diskStore)
	staged, err := d.staging()
	if err != nil {
		t.Fatal(err)
	}
	c := &lookupCounter{diskStore: staged}
	st, err := readSnapshotInto(bufio.NewReader(bytes.NewReader(stream)), func(*fsmpb.SnapshotHeader) (*state, error) {
		return newStateWith(c), nil
	})
	return st, c.lookups, err
}

// TestRestoreOnDiskSkipsLookups: an install into the store on disk knows
// each id and key new from the stream alone (restoreSeen), so a stream
// without duplicates asks the engine nothing, in both id formats; the
// installed state holds every task. When hashes collide, the engine
// decides, and the state is the same; duplicate ids and keys are refused
// either way.
func TestRestoreOnDiskSkipsLookups(t *testing.T) {
	for _, format := range []uint32{FormatShardIDs, FormatGroupIDs, MaxFormat} {
		src := New(Options{})
		src.st.format = format
		st := src.st
		st.clock = 100
		const n = 3000
		for i := range n {
			q := st.queueFor(fmt.Sprintf("g%d/q%d", i%7, i%3))
			tk := &task{id: fmt.Sprintf("t%05d", i), q: q, value: []byte{byte(i)}, version: uint64(1 + i%3), at: int64(i % 50)}
			if i%4 == 0 {
				tk.key = fmt.Sprintf("k%d", i)
			}
			st.add(tk)
		}
		want := persist(t, src)

		for _, collide := range []bool{false, true} {
			name := fmt.Sprintf("format %d, collide %v", format, collide)
			if collide {
				restoreHash = func(maphash.Seed, string, string) uint64 { return 1 }
			}
			got, lookups, err := installCounted(t, want)
			restoreHash = pairHash
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if !collide && lookups != 0 {
				t.Errorf("%s: %d engine lookups for a stream without duplicates, want 0", name, lookups)
			}
			if collide && lookups < n-1 {
				t.Errorf("%s: %d engine lookups with every hash colliding, want at least %d", name, lookups, n-1)
			}
			if got.store.count() != n {
				t.Errorf("%s: %d tasks installed, want %d", name, got.store.count(), n)
			}
			for i := range n {
				if got.find(fmt.Sprintf("g%d", i%7), fmt.Sprintf("t%05d", i)) == nil {
					t.Fatalf("%s: task t%05d missing", name, i)
				}
			}
		}
		// Through Restore, the machine on disk holds the source's state.
		m := diskMachine(t, Options{})
		if err := m.Restore(io.NopCloser(bytes.NewReader(want))); err != nil {
			t.Fatal(err)
		}
		if got := persist(t, m); !bytes.Equal(got, want) {
			t.Errorf("format %d: the restored state differs from its source", format)
		}
	}

	build := func(format uint32, recs ...*fsmpb.SnapshotRecord) []byte {
		var buf bytes.Buffer
		sw := &snapshotWriter{w: bufioWriter(&buf)}
		sw.write([]byte(snapshotMagic))
		h := &fsmpb.SnapshotHeader{Format: snapshotFormat, Tasks: uint64(len(recs))}
		if format > 0 {
			h.Format, h.StateFormat = snapshotFormatStated, format
		}
		sw.record(&fsmpb.SnapshotRecord{Header: h})
		for _, r := range recs {
			sw.record(r)
		}
		sw.record(&fsmpb.SnapshotRecord{Trailer: &fsmpb.SnapshotTrailer{Crc32C: sw.crc}})
		sw.w.Flush()
		return buf.Bytes()
	}
	task := func(id, queue, key string) *fsmpb.SnapshotRecord {
		return &fsmpb.SnapshotRecord{Task: &fsmpb.Task{Id: id, Queue: queue, Key: key, Version: 1}}
	}
	refused := map[string][]byte{
		"duplicate id":                  build(FormatGroupIDs, task("a", "g/q", ""), task("b", "g/q", ""), task("a", "g/r", "")),
		"duplicate id in two groups":    build(FormatShardIDs, task("a", "g/q", ""), task("a", "h/q", "")),
		"duplicate key":                 build(FormatGroupIDs, task("a", "g/q", "k"), task("b", "g/q", "x"), task("c", "g/q", "k")),
		"duplicate id, second batch":    build(FormatGroupIDs, append(manyTasks(installBatch+5), task("t00003", "g/q", ""))...),
		"duplicate key across a commit": build(FormatGroupIDs, append(manyTasks(installBatch+5), task("z", "g/q", "k3"))...),
	}
	for name, data := range refused {
		if _, _, err := installCounted(t, data); !errors.Is(err, ErrCorruptSnapshot) {
			t.Errorf("%s: got %v, want %v", name, err, ErrCorruptSnapshot)
		}
	}
	// The same id in two groups is two tasks from FormatGroupIDs on.
	if _, _, err := installCounted(t, build(FormatGroupIDs, task("a", "g/q", ""), task("a", "h/q", ""))); err != nil {
		t.Errorf("one id in two groups: %v", err)
	}
}

// manyTasks is n tasks of queue g/q, ids t00000..., every one keyed k<i>.
func manyTasks(n int) []*fsmpb.SnapshotRecord {
	var recs []*fsmpb.SnapshotRecord
	for i := range n {
		recs = append(recs, &fsmpb.SnapshotRecord{Task: &fsmpb.Task{Id: fmt.Sprintf("t%05d", i), Queue: "g/q", Key: fmt.Sprintf("k%d", i), Version: 1}})
	}
	return recs
}
