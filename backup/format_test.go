package backup

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// sample writes a backup of the map and two shards; shard 2's data is
// larger than a chunk, so that it spans several.
func sample(t testing.TB, shard2 int) ([]byte, *Manifest) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	parts := []struct {
		kind Kind
		id   uint32
		data []byte
	}{
		{KindMap, 0, []byte("the map")},
		{KindShard, 1, []byte("shard one's state")},
		{KindShard, 2, bytes.Repeat([]byte{7}, shard2)},
	}
	for _, p := range parts {
		pw, err := w.Part(p.kind, p.id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pw.Write(p.data); err != nil {
			t.Fatal(err)
		}
		if _, err := pw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	m := &Manifest{ClusterID: "c1", Started: time.Unix(1, 0).UTC(), Slots: 4,
		Shards: []ShardInfo{{ID: 1, Index: 10, Tasks: 1, Slots: "0,2"}, {ID: 2, Index: 20, Tasks: 2, Slots: "1,3"}}}
	if err := w.Finish(m); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), m
}

func TestRoundTrip(t *testing.T) {
	data, want := sample(t, MaxChunk+5)
	r := NewReader(bytes.NewReader(data))
	var got []string
	for {
		p, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(p)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, p.Name()+":"+string(b[:min(len(b), 5)]))
	}
	if s := strings.Join(got, " "); s != "cluster map:the m shard 1:shard shard 2:\a\a\a\a\a" {
		t.Fatalf("parts: %s", s)
	}
	m := r.Manifest()
	if m.ClusterID != "c1" || m.Tasks() != 3 || m.Shard(2).Bytes != MaxChunk+5 || m.Shard(2).CRC32C != want.Shard(2).CRC32C {
		t.Fatalf("manifest: %+v", m)
	}
}

// A part may be skipped without reading it: Next still checks it.
func TestSkippedPartIsChecked(t *testing.T) {
	data, _ := sample(t, 100)
	i := bytes.Index(data, bytes.Repeat([]byte{7}, 100))
	data[i+50] ^= 1
	_, err := Verify(bytes.NewReader(data), nil)
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Part != "shard 2" || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("err = %v", err)
	}
}

// Every single flipped byte and every truncation is refused with a
// CorruptError; none is accepted or panics.
func TestEveryFlipAndTruncationRefused(t *testing.T) {
	data, _ := sample(t, 300)
	if _, err := Verify(bytes.NewReader(data), nil); err != nil {
		t.Fatal(err)
	}
	for i := range data {
		for _, bit := range []byte{1, 0x80} {
			bad := bytes.Clone(data)
			bad[i] ^= bit
			_, err := Verify(bytes.NewReader(bad), nil)
			var ce *CorruptError
			if !errors.As(err, &ce) {
				t.Fatalf("byte %d ^ %02x: err = %v", i, bit, err)
			}
		}
	}
	for n := 0; n < len(data); n++ {
		_, err := Verify(bytes.NewReader(data[:n]), nil)
		var ce *CorruptError
		if !errors.As(err, &ce) {
			t.Fatalf("truncated to %d: err = %v", n, err)
		}
	}
	_, err := Verify(bytes.NewReader(append(bytes.Clone(data), 0)), nil)
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a byte after the end: err = %v", err)
	}
}

// The part a damaged byte is in is the one the error names.
func TestErrorNamesThePart(t *testing.T) {
	data, _ := sample(t, 300)
	for _, c := range []struct {
		at   string
		part string
	}{{"the map", "cluster map"}, {"shard one's", "shard 1"}, {`"cluster_id"`, "manifest"}} {
		bad := bytes.Clone(data)
		bad[bytes.Index(bad, []byte(c.at))+2] ^= 0x20
		_, err := Verify(bytes.NewReader(bad), nil)
		var ce *CorruptError
		if !errors.As(err, &ce) || ce.Part != c.part {
			t.Errorf("damage in %q: err = %v, want part %q", c.at, err, c.part)
		}
	}
}

func TestFinishRefusesAManifestThatDoesNotMatch(t *testing.T) {
	w, _ := NewWriter(io.Discard)
	pw, _ := w.Part(KindMap, 0)
	pw.Close()
	pw, _ = w.Part(KindShard, 1)
	pw.Close()
	if err := w.Finish(&Manifest{ClusterID: "c", Shards: []ShardInfo{{ID: 1}, {ID: 2}}}); err == nil {
		t.Fatal("a manifest naming a shard with no part was accepted")
	}
	if err := w.Finish(&Manifest{ClusterID: "c"}); err == nil {
		t.Fatal("a manifest missing a shard was accepted")
	}
}

func TestSlotRanges(t *testing.T) {
	table := []uint32{1, 1, 2, 1, 3, 3, 3, 1}
	for shard, want := range map[uint32]string{1: "0-1,3,7", 2: "2", 3: "4-6", 4: ""} {
		if got := SlotRanges(table, shard); got != want {
			t.Errorf("shard %d: %q, want %q", shard, got, want)
		}
	}
}

func FuzzVerify(f *testing.F) {
	data, _ := sample(f, 40)
	f.Add(data)
	f.Add(data[:len(data)/2])
	f.Add([]byte("TSBACKUP\x00\x00\x00\x01P\x53\x01\xff\xff\xff\xff\x0f"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Verify(bytes.NewReader(b), nil)
		if err == nil {
			if m == nil || m.ClusterID == "" {
				t.Fatalf("accepted without a manifest: %+v", m)
			}
			return
		}
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("error not wrapping ErrCorrupt: %v", err)
		}
	})
}
