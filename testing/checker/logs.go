package checker

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"

	"github.com/e1158ecb/taskstore/cluster/nodelog"
)

// LogReader reads a replica's Raft log; raft.LogStore and
// cluster.Shard.Log() satisfy it.
type LogReader interface {
	FirstIndex() (uint64, error)
	LastIndex() (uint64, error)
	GetLog(index uint64, log *raft.Log) error
}

// LogEntry is what the log checker compares of one Raft log entry.
type LogEntry struct {
	Index, Term uint64
	Type        raft.LogType
	// Hash covers the entry's data and extensions.
	Hash [32]byte
	// AppendedAt is the leader's time when it appended the entry; it is
	// replicated with the entry, so it is printed, not compared.
	AppendedAt time.Time
}

// ReplicaLog is one replica's log of one shard, contiguous and ascending.
type ReplicaLog struct {
	Shard   uint32
	Node    string
	Entries []LogEntry
}

// ReadLog reads r's entries from its first index up to upTo (its last
// index when upTo is 0).
func ReadLog(shard uint32, node string, r LogReader, upTo uint64) (ReplicaLog, error) {
	out := ReplicaLog{Shard: shard, Node: node}
	first, err := r.FirstIndex()
	if err != nil {
		return out, fmt.Errorf("shard %d on %s: first index: %w", shard, node, err)
	}
	last, err := r.LastIndex()
	if err != nil {
		return out, fmt.Errorf("shard %d on %s: last index: %w", shard, node, err)
	}
	if upTo != 0 && upTo < last {
		last = upTo
	}
	if first == 0 || last < first {
		return out, nil
	}
	out.Entries = make([]LogEntry, 0, last-first+1)
	for i := first; i <= last; i++ {
		var e raft.Log
		if err := r.GetLog(i, &e); err != nil {
			return out, fmt.Errorf("shard %d on %s: entry %d: %w", shard, node, i, err)
		}
		h := sha256.New()
		h.Write(e.Data)
		h.Write([]byte{0})
		h.Write(e.Extensions)
		le := LogEntry{Index: e.Index, Term: e.Term, Type: e.Type, AppendedAt: e.AppendedAt}
		h.Sum(le.Hash[:0])
		out.Entries = append(out.Entries, le)
	}
	return out, nil
}

// ReadLogFile reads a raft-boltdb log file (a group's raft.db) read-only,
// after its node stopped: bolt locks the file while a node has it open.
func ReadLogFile(shard uint32, node, path string) (ReplicaLog, error) {
	s, err := raftboltdb.New(raftboltdb.Options{Path: path, BoltOptions: &bbolt.Options{ReadOnly: true, Timeout: 5 * time.Second}})
	if err != nil {
		return ReplicaLog{Shard: shard, Node: node}, fmt.Errorf("open %s: %w", path, err)
	}
	defer s.Close()
	return ReadLog(shard, node, s, 0)
}

// ReadDataDir reads the Raft log of every shard replica in a stopped node's
// data directory: the shards with a directory under shards/, their entries
// from the node log (raftlog/, opened read-only) or, for a directory from
// before the node log, from the shard's raft.db.
func ReadDataDir(node, dataDir string) ([]ReplicaLog, error) {
	dirs, err := os.ReadDir(filepath.Join(dataDir, "shards"))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", node, err)
	}
	var nl *nodelog.Log
	if _, err := os.Stat(filepath.Join(dataDir, "raftlog")); err == nil {
		if nl, err = nodelog.Open(filepath.Join(dataDir, "raftlog"), nodelog.Options{ReadOnly: true}); err != nil {
			return nil, fmt.Errorf("%s: %w", node, err)
		}
		defer nl.Close()
	}
	var out []ReplicaLog
	for _, d := range dirs {
		shard, err := strconv.ParseUint(d.Name(), 10, 32)
		if err != nil || !d.IsDir() {
			continue
		}
		var l ReplicaLog
		if nl != nil {
			l, err = ReadLog(uint32(shard), node, nl.Group(uint32(shard)), 0)
		} else {
			path := filepath.Join(dataDir, "shards", d.Name(), "raft.db")
			if _, serr := os.Stat(path); serr != nil {
				continue
			}
			l, err = ReadLogFile(uint32(shard), node, path)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", node, err)
		}
		out = append(out, l)
	}
	return out, nil
}

// LogAgreement compares the replicas' logs of each shard entry by entry over
// the range every one of them holds (a compacted prefix or a shorter tail is
// not compared). Raft's Log Matching property says two logs with an entry of
// the same index and term hold the same entries up to it; so at each index
// every replica must have the same term, type and data. The first index
// that breaks it is reported per shard, with each replica's entry: that is
// how hashicorp/raft#695 looked (testdata/replica-divergence),
// and why Raft's own check could not notice it. It returns the violations
// and how many entries it compared.
func LogAgreement(logs []ReplicaLog) ([]Violation, int) {
	byShard := map[uint32][]ReplicaLog{}
	for _, l := range logs {
		byShard[l.Shard] = append(byShard[l.Shard], l)
	}
	shards := make([]uint32, 0, len(byShard))
	for s := range byShard {
		shards = append(shards, s)
	}
	sort.Slice(shards, func(i, j int) bool { return shards[i] < shards[j] })
	var out []Violation
	compared := 0
	for _, s := range shards {
		reps := byShard[s]
		sort.Slice(reps, func(i, j int) bool { return reps[i].Node < reps[j].Node })
		if len(reps) < 2 {
			out = append(out, Violation{Checker: NameLogs, Detail: fmt.Sprintf("shard %d: only %d replica's log read", s, len(reps))})
			continue
		}
		var lo, hi uint64 = 0, ^uint64(0)
		for _, r := range reps {
			if len(r.Entries) == 0 {
				hi = 0
				continue
			}
			lo = max(lo, r.Entries[0].Index)
			hi = min(hi, r.Entries[len(r.Entries)-1].Index)
		}
		diffs := 0
		for idx := lo; idx <= hi && hi != 0; idx++ {
			ref := entryAt(reps[0], idx)
			same := true
			for _, r := range reps[1:] {
				e := entryAt(r, idx)
				if e.Term != ref.Term || e.Type != ref.Type || !bytes.Equal(e.Hash[:], ref.Hash[:]) {
					same = false
				}
			}
			compared++
			if same {
				continue
			}
			diffs++
			if diffs > 1 {
				continue // the first difference is reported; the count follows
			}
			var b strings.Builder
			fmt.Fprintf(&b, "shard %d: replicas' logs differ at index %d:", s, idx)
			for _, r := range reps {
				e := entryAt(r, idx)
				fmt.Fprintf(&b, " %s={term %d %s data %x appended %s}", r.Node, e.Term, e.Type, e.Hash[:6], e.AppendedAt.UTC().Format("15:04:05.000"))
			}
			out = append(out, Violation{Checker: NameLogs, Detail: b.String()})
		}
		if diffs > 1 {
			out[len(out)-1].Detail += fmt.Sprintf(" (and %d more differing indexes in [%d, %d])", diffs-1, lo, hi)
		}
	}
	return out, compared
}

func entryAt(r ReplicaLog, idx uint64) LogEntry {
	return r.Entries[idx-r.Entries[0].Index]
}
