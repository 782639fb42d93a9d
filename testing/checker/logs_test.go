package checker_test

import (
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/testing/checker"
	"github.com/e1158ecb/taskstore/testing/workload"
)

// evidence unpacks the three diverged replicas' log files of shard 2.
func evidence(t *testing.T) map[string]string {
	t.Helper()
	dir := t.TempDir()
	out := map[string]string{}
	for _, n := range []string{"n1", "n2", "n3"} {
		in, err := os.Open(filepath.Join("testdata", "replica-divergence", n+"-shard2-raft.db.gz"))
		if err != nil {
			t.Fatal(err)
		}
		zr, err := gzip.NewReader(in)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, n+".db")
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(f, zr); err != nil {
			t.Fatal(err)
		}
		f.Close()
		in.Close()
		out[n] = p
	}
	return out
}

func TestLogAgreementCatchesTheEvidence(t *testing.T) {
	files := evidence(t)
	var logs []checker.ReplicaLog
	for _, n := range []string{"n1", "n2", "n3"} {
		l, err := checker.ReadLogFile(2, n, files[n])
		if err != nil {
			t.Fatal(err)
		}
		logs = append(logs, l)
	}
	vs, compared := checker.LogAgreement(logs)
	if compared < 2000 {
		t.Errorf("compared %d entries, want the ~2228 all three hold", compared)
	}
	if len(vs) != 1 {
		t.Fatalf("want one violation (index 437), got %d: %v", len(vs), vs)
	}
	d := vs[0].Detail
	t.Logf("%s", vs[0])
	for _, want := range []string{"index 437:", "n1={term 6 LogNoop", "n2={term 6 LogCommand", "n3={term 6 LogNoop"} {
		if !strings.Contains(d, want) {
			t.Errorf("violation %q does not say %q", d, want)
		}
	}
	if strings.Contains(d, "more differing") {
		t.Errorf("only index 437 differs, got %q", d)
	}

	// The two replicas that agree pass.
	if vs, n := checker.LogAgreement([]checker.ReplicaLog{logs[0], logs[2]}); len(vs) != 0 || n == 0 {
		t.Errorf("n1 and n3 agree, got %v over %d entries", vs, n)
	}
	// All fails through checker.All too.
	r := checker.All(checker.Input{History: workload.NewHistory(), Final: &workload.Final{}, Logs: logs})
	if !r.Has(checker.NameLogs, "") {
		t.Errorf("All did not run the log checker: %v", r.Violations)
	}
}

// memLog is an in-memory log from first, one entry per (term, data).
type memLog struct {
	first   uint64
	entries []raft.Log
}

func newMemLog(first uint64, spec ...string) *memLog {
	m := &memLog{first: first}
	for i, s := range spec {
		// "t3:x": term 3, data x; "t3:noop" is a LogNoop.
		term := uint64(s[1] - '0')
		data := s[3:]
		e := raft.Log{Index: first + uint64(i), Term: term, Type: raft.LogCommand, Data: []byte(data)}
		if data == "noop" {
			e.Type, e.Data = raft.LogNoop, nil
		}
		m.entries = append(m.entries, e)
	}
	return m
}

func (m *memLog) FirstIndex() (uint64, error) {
	if len(m.entries) == 0 {
		return 0, nil
	}
	return m.first, nil
}

func (m *memLog) LastIndex() (uint64, error) {
	if len(m.entries) == 0 {
		return 0, nil
	}
	return m.first + uint64(len(m.entries)) - 1, nil
}

func (m *memLog) GetLog(i uint64, l *raft.Log) error {
	if i < m.first || i >= m.first+uint64(len(m.entries)) {
		return raft.ErrLogNotFound
	}
	*l = m.entries[i-m.first]
	return nil
}

func TestLogAgreement(t *testing.T) {
	cases := []struct {
		name     string
		a, b     *memLog
		upTo     uint64
		want     string // substring of the one violation; "" for none
		compared int
	}{
		{"same", newMemLog(1, "t1:a", "t1:b", "t2:noop"), newMemLog(1, "t1:a", "t1:b", "t2:noop"), 0, "", 3},
		{"compacted prefix and longer tail are not compared", newMemLog(3, "t2:noop", "t2:c", "t2:d"), newMemLog(1, "t1:a", "t1:b", "t2:noop", "t2:c"), 0, "", 2},
		{"same term, other data (raft#695)", newMemLog(1, "t1:a", "t2:noop", "t2:c"), newMemLog(1, "t1:a", "t2:claim", "t2:c"), 0, "index 2:", 3},
		{"other term", newMemLog(1, "t1:a", "t1:b"), newMemLog(1, "t1:a", "t2:b"), 0, "index 2:", 2},
		{"a difference past upTo is not compared", newMemLog(1, "t1:a", "t1:b"), newMemLog(1, "t1:a", "t2:b"), 1, "", 1},
		{"two differences: the first is named, the rest counted", newMemLog(1, "t1:a", "t1:b", "t1:c"), newMemLog(1, "t1:x", "t1:b", "t1:y"), 0, "and 1 more", 3},
		{"an empty log compares nothing", newMemLog(1), newMemLog(1, "t1:a"), 0, "", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, err := checker.ReadLog(1, "a", tc.a, tc.upTo)
			if err != nil {
				t.Fatal(err)
			}
			b, err := checker.ReadLog(1, "b", tc.b, tc.upTo)
			if err != nil {
				t.Fatal(err)
			}
			vs, n := checker.LogAgreement([]checker.ReplicaLog{b, a})
			if n != tc.compared {
				t.Errorf("compared %d entries, want %d", n, tc.compared)
			}
			switch {
			case tc.want == "" && len(vs) != 0:
				t.Errorf("want no violation, got %v", vs)
			case tc.want != "" && (len(vs) != 1 || !strings.Contains(vs[0].Detail, tc.want)):
				t.Errorf("want one violation saying %q, got %v", tc.want, vs)
			}
		})
	}
	if vs, _ := checker.LogAgreement([]checker.ReplicaLog{{Shard: 4, Node: "a"}}); len(vs) != 1 {
		t.Errorf("a shard with one replica's log must be reported, got %v", vs)
	}
}
