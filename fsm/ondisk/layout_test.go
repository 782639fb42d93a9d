package ondisk

import (
	"bytes"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestClaimKeysSortInClaimOrder: the byte order of claim keys is fsm's
// claim order (priority descending, at ascending, id ascending), queue by
// queue, shard by shard; parsing gives back what was encoded.
func TestClaimKeysSortInClaimOrder(t *testing.T) {
	type entry struct {
		shard, queue uint32
		priority     int32
		at           int64
		id           string
	}
	less := func(a, b entry) int {
		switch {
		case a.shard != b.shard:
			return cmpU(a.shard, b.shard)
		case a.queue != b.queue:
			return cmpU(a.queue, b.queue)
		case a.priority != b.priority:
			return -cmpI(int64(a.priority), int64(b.priority))
		case a.at != b.at:
			return cmpI(a.at, b.at)
		}
		return bytes.Compare([]byte(a.id), []byte(b.id))
	}
	r := rand.New(rand.NewPCG(1, 2))
	prios := []int32{math.MinInt32, -5, -1, 0, 1, 7, math.MaxInt32}
	ats := []int64{math.MinInt64, -1, 0, 1, 1 << 40, math.MaxInt64}
	var es []entry
	for range 2000 {
		es = append(es, entry{
			shard:    uint32(r.IntN(3)),
			queue:    []uint32{0, 1, 255, 256, math.MaxUint32}[r.IntN(5)],
			priority: prios[r.IntN(len(prios))],
			at:       ats[r.IntN(len(ats))],
			id:       []string{"", "a", "a\x00", "ab", "b", "\xff"}[r.IntN(6)],
		})
	}
	byKey := slices.Clone(es)
	slices.SortStableFunc(byKey, func(a, b entry) int {
		return bytes.Compare(ClaimKey(a.shard, a.queue, a.priority, a.at, a.id), ClaimKey(b.shard, b.queue, b.priority, b.at, b.id))
	})
	slices.SortStableFunc(es, less)
	for i := range es {
		if less(es[i], byKey[i]) != 0 {
			t.Fatalf("position %d: claim order has %+v, key order %+v", i, es[i], byKey[i])
		}
		e := es[i]
		s, q, p, at, id, err := ParseClaimKey(ClaimKey(e.shard, e.queue, e.priority, e.at, e.id))
		if err != nil || s != e.shard || q != e.queue || p != e.priority || at != e.at || id != e.id {
			t.Fatalf("parse(%+v) = %d %d %d %d %q %v", e, s, q, p, at, id, err)
		}
		ds, dat, dq, did, err := ParseDueKey(DueKey(e.shard, e.at, e.queue, e.id))
		if err != nil || ds != e.shard || dat != e.at || dq != e.queue || did != e.id {
			t.Fatalf("due parse(%+v) = %d %d %d %q %v", e, ds, dat, dq, did, err)
		}
	}
}

// TestShardRangesHoldTheirKeys: every table's keys of a shard fall in
// [ShardPrefix, ShardEnd), and no other shard's do.
func TestShardRangesHoldTheirKeys(t *testing.T) {
	for _, shard := range []uint32{0, 1, 7, math.MaxUint32 - 1, math.MaxUint32} {
		keys := [][]byte{TaskKey(shard, "\xff", "\xff\xff"), ClaimKey(shard, math.MaxUint32, math.MinInt32, math.MaxInt64, "\xff"),
			DueKey(shard, math.MaxInt64, math.MaxUint32, "\xff"), UniqueKey(shard, 3, "k"), QueueKey(shard, "q"), MetaKey(shard, "applied"),
			SessionKey(shard, "\xff"), SessionOrderKey(shard, math.MaxInt64, "\xff")}
		for _, k := range keys {
			if bytes.Compare(k, ShardPrefix(shard)) < 0 || bytes.Compare(k, ShardEnd(shard)) >= 0 {
				t.Errorf("shard %d: key %x outside [%x, %x)", shard, k, ShardPrefix(shard), ShardEnd(shard))
			}
			if shard > 0 && bytes.Compare(k, ShardEnd(shard-1)) < 0 {
				t.Errorf("shard %d: key %x inside shard %d", shard, k, shard-1)
			}
		}
	}
}

func TestParseRefusesOtherKeys(t *testing.T) {
	for _, k := range [][]byte{nil, TaskKey(1, "g", "abcdefghijklmnopqrstuvwxyz"), ClaimPrefix(1, 2), DueKey(1, 5, 2, "x")[:16]} {
		if _, _, _, _, _, err := ParseClaimKey(k); err == nil {
			t.Errorf("ParseClaimKey(%x) accepted", k)
		}
	}
	if _, _, _, _, err := ParseDueKey(ClaimKey(1, 2, 3, 4, "x")); err == nil {
		t.Error("ParseDueKey accepted a claim key")
	}
}

// TestDigestIsOrderIndependent: the same set reached by different orders
// of adds and removes has the same digest; a different value does not.
func TestDigestIsOrderIndependent(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var recs [][2][]byte
	for i := range 200 {
		recs = append(recs, [2][]byte{TaskKey(1, "g", string(rune('a'+i%26))+string(rune(i))), []byte{byte(i), byte(i >> 8)}})
	}
	var a, b Digest
	for _, rec := range recs {
		a.Add(rec[0], rec[1])
	}
	// b: a shuffled order, with extra records added and removed again.
	perm := r.Perm(len(recs))
	for i, j := range perm {
		b.Add(recs[j][0], recs[j][1])
		if i%7 == 0 {
			b.Add([]byte("temp"), []byte{byte(i)})
			b.Remove([]byte("temp"), []byte{byte(i)})
		}
	}
	if a != b {
		t.Fatalf("same set, different digests: %x %x", a.Bytes(), b.Bytes())
	}
	if DigestFromBytes(a.Bytes()) != a {
		t.Fatal("digest does not round-trip through Bytes")
	}
	b.Remove(recs[0][0], recs[0][1])
	b.Add(recs[0][0], []byte("other"))
	if a == b {
		t.Fatal("a changed value left the digest unchanged")
	}
	// Moving bytes between key and value is a different record.
	var c, d Digest
	c.Add([]byte("ab"), []byte("c"))
	d.Add([]byte("a"), []byte("bc"))
	if c == d {
		t.Fatal("key/value boundary not in the digest")
	}
}

func cmpU(a, b uint32) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func cmpI(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func TestReservationOrderKeysSortByEndQueueKey(t *testing.T) {
	type res struct {
		until      int64
		queue, key string
	}
	in := []res{{5, "b", "k"}, {5, "aa", "z"}, {5, "a", "zz"}, {5, "a\x00b", "k"}, {5, "a", "y"}, {-1, "z", "k"}, {7, "", "k"}}
	keys := make([][]byte, len(in))
	for i, r := range in {
		keys[i] = ReservationOrderKey(3, r.until, r.queue, r.key)
		until, q, k, err := ParseReservationOrderKey(keys[i])
		if err != nil || until != r.until || q != r.queue || k != r.key {
			t.Fatalf("parse %v: %d %q %q %v", r, until, q, k, err)
		}
	}
	less := func(a, b res) bool {
		if a.until != b.until {
			return a.until < b.until
		}
		if a.queue != b.queue {
			return a.queue < b.queue
		}
		return a.key < b.key
	}
	for i := range in {
		for j := range in {
			if got, want := bytes.Compare(keys[i], keys[j]) < 0, less(in[i], in[j]); got != want {
				t.Errorf("%v < %v: keys say %v, want %v", in[i], in[j], got, want)
			}
		}
	}
}

// TestSortOpsIsKeyOrder checks commitSorted's order against a stable sort
// by bytes.Compare, on keys that share prefixes of every length (all of
// them, or none while none is empty), differ in length and end in zero
// bytes, where the padded words alone tie.
func TestSortOpsIsKeyOrder(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	alphabet := []byte{0, 1, 0x74, 0xff}
	for _, c := range []struct {
		prefix []byte
		least  int // the shortest key's length past the prefix
	}{{nil, 0}, {nil, 9}, {[]byte{0, 0, 0, 7}, 0}, {[]byte{0, 0, 0, 7, 0x74, 1, 2, 3, 4, 5}, 0}} {
		prefix := c.prefix
		var ops []batchOp
		for range 2000 {
			k := append([]byte(nil), prefix...)
			for range c.least + rnd.IntN(20) {
				k = append(k, alphabet[rnd.IntN(len(alphabet))])
			}
			ops = append(ops, batchOp{key: k})
		}
		want := make([]int, len(ops))
		for i := range want {
			want[i] = i
		}
		slices.SortStableFunc(want, func(a, b int) int { return bytes.Compare(ops[a].key, ops[b].key) })
		for i, o := range sortOps(ops, nil) {
			if int(o.i) != want[i] {
				t.Fatalf("prefix %x: place %d holds write %d (%x), want %d (%x)", prefix, i, o.i, ops[o.i].key, want[i], ops[want[i]].key)
			}
		}
	}
}

// TestAppendKeysAreTheKeys: the append forms a transaction builds keys
// with give the keys, after whatever the buffer held.
func TestAppendKeysAreTheKeys(t *testing.T) {
	junk := []byte("junk")
	for _, c := range []struct{ got, want []byte }{
		{appendTaskKey(junk[:0:0], 7, "g", "id-1"), TaskKey(7, "g", "id-1")},
		{appendTaskKey(bytes.Clone(junk)[:0], 7, "", "x"), TaskKey(7, "", "x")},
		{appendClaimKey(bytes.Clone(junk)[:0], 7, 3, -5, -9, "id"), ClaimKey(7, 3, -5, -9, "id")},
		{appendDueKey(bytes.Clone(junk)[:0], 7, 1<<40, 3, "id"), DueKey(7, 1<<40, 3, "id")},
		{appendSessionKey(bytes.Clone(junk)[:0], 7, "client"), SessionKey(7, "client")},
	} {
		if !bytes.Equal(c.got, c.want) {
			t.Errorf("got %x, want %x", c.got, c.want)
		}
	}
}
