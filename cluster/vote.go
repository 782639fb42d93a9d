package cluster

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// Keys hashicorp/raft keeps its term and vote under in the stable store.
var (
	keyCurrentTerm  = []byte("CurrentTerm")
	keyLastVoteTerm = []byte("LastVoteTerm")
	keyLastVoteCand = []byte("LastVoteCand")
)

// voteFile is a group's own record of its term and vote, beside its
// raft.db: a raft.db that is emptied, cut short or restored from an older
// copy loses the term and vote raft persisted there, and a replica that
// forgets its vote can vote twice in one term (two leaders). The record is
// written, synced, before raft.db on every change, so it is never behind.
const voteFile = "vote"

// voteRecord is what raft persisted last about its term and vote.
type voteRecord struct {
	Term     uint64 // CurrentTerm
	VoteTerm uint64 // LastVoteTerm
	Cand     []byte // LastVoteCand
}

// encode: term, vote term, candidate length, candidate, then a CRC-32C.
func (v voteRecord) encode() []byte {
	b := binary.BigEndian.AppendUint64(nil, v.Term)
	b = binary.BigEndian.AppendUint64(b, v.VoteTerm)
	b = binary.BigEndian.AppendUint32(b, uint32(len(v.Cand)))
	b = append(b, v.Cand...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
}

func decodeVoteRecord(b []byte) (voteRecord, error) {
	if len(b) < 24 {
		return voteRecord{}, fmt.Errorf("%d bytes, too short", len(b))
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli)) != sum {
		return voteRecord{}, errors.New("checksum mismatch")
	}
	n := binary.BigEndian.Uint32(body[16:])
	if int(n) != len(body)-20 {
		return voteRecord{}, errors.New("bad candidate length")
	}
	return voteRecord{Term: binary.BigEndian.Uint64(body), VoteTerm: binary.BigEndian.Uint64(body[8:]), Cand: bytes.Clone(body[20:])}, nil
}

// readVoteRecord reads a group's record; ok is false when it has none.
func readVoteRecord(dir string) (rec voteRecord, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, voteFile))
	if errors.Is(err, os.ErrNotExist) {
		return voteRecord{}, false, nil
	}
	if err != nil {
		return voteRecord{}, false, err
	}
	rec, err = decodeVoteRecord(b)
	if err != nil {
		return voteRecord{}, false, fmt.Errorf("%s: %w", filepath.Join(dir, voteFile), err)
	}
	return rec, true, nil
}

// writeVoteRecord replaces the record durably: a temporary file, synced,
// renamed over it, and the directory synced.
func writeVoteRecord(dir string, v voteRecord) error {
	path := filepath.Join(dir, voteFile)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(v.encode()); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// stableTerms reads the term and vote raft keeps in a stable store.
func stableTerms(s raft.StableStore) voteRecord {
	var v voteRecord
	v.Term, _ = s.GetUint64(keyCurrentTerm)
	v.VoteTerm, _ = s.GetUint64(keyLastVoteTerm)
	v.Cand, _ = s.Get(keyLastVoteCand)
	return v
}

// keptStable is the stable store raft runs on: the group's raft.db, with
// every change of the term or the vote written to the vote record first.
type keptStable struct {
	raft.StableStore
	dir string
	mu  sync.Mutex
	rec voteRecord
	// mark, for the meta group, is the data directory's metaVotedMark,
	// written once with the first vote record; "" once written.
	mark string
}

// metaVotedMark is a file in the data directory (outside meta/) that says
// the node's meta replica has had a term: a meta raft.db and vote record
// both gone are otherwise a new replica, which would vote (and could vote
// twice in a term, or elect a leader missing entries it acknowledged).
const metaVotedMark = "meta-voted"

// markVoted writes the mark if it is not there yet (synced, with its
// directory). The caller holds k.mu or owns k.
func (k *keptStable) markVoted() error {
	if k.mark == "" {
		return nil
	}
	if _, err := os.Stat(k.mark); err == nil {
		k.mark = ""
		return nil
	}
	f, err := os.OpenFile(k.mark, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("write %s: %w", k.mark, err)
	}
	_, err = f.WriteString("this node's meta replica has voted: do not delete this file alone (docs/operations.md)\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		var d *os.File
		if d, err = os.Open(filepath.Dir(k.mark)); err == nil {
			err = d.Sync()
			d.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", k.mark, err)
	}
	k.mark = ""
	return nil
}

func (k *keptStable) keep(update func(*voteRecord)) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	next := k.rec
	update(&next)
	if err := writeVoteRecord(k.dir, next); err != nil {
		return fmt.Errorf("write the vote record: %w", err)
	}
	k.rec = next
	return k.markVoted()
}

func (k *keptStable) Set(key, val []byte) error {
	if bytes.Equal(key, keyLastVoteCand) {
		if err := k.keep(func(v *voteRecord) { v.Cand = bytes.Clone(val) }); err != nil {
			return err
		}
	}
	return k.StableStore.Set(key, val)
}

func (k *keptStable) SetUint64(key []byte, val uint64) error {
	var err error
	switch {
	case bytes.Equal(key, keyCurrentTerm):
		err = k.keep(func(v *voteRecord) { v.Term = val })
	case bytes.Equal(key, keyLastVoteTerm):
		err = k.keep(func(v *voteRecord) { v.VoteTerm = val })
	}
	if err != nil {
		return err
	}
	return k.StableStore.SetUint64(key, val)
}

// restoreTerms makes the stable store hold at least what the vote record
// proves. It returns whether the store had lost part of it.
func restoreTerms(s raft.StableStore, rec voteRecord) (bool, error) {
	have := stableTerms(s)
	if have.Term >= rec.Term && have.VoteTerm >= rec.VoteTerm {
		return false, nil
	}
	if rec.VoteTerm > have.VoteTerm {
		if err := s.Set(keyLastVoteCand, rec.Cand); err != nil {
			return true, err
		}
		if err := s.SetUint64(keyLastVoteTerm, rec.VoteTerm); err != nil {
			return true, err
		}
	}
	if rec.Term > have.Term {
		if err := s.SetUint64(keyCurrentTerm, rec.Term); err != nil {
			return true, err
		}
	}
	return true, nil
}

// voteHold keeps a replica that lost its Raft log (the meta group's lives
// in its raft.db) from voting or standing for election until it has caught
// up: with an empty log it would grant its vote to a candidate missing
// entries it had acknowledged, and a committed entry could be lost.
// hashicorp/raft has no switch for that, so the group's transport does it:
// it answers every vote request with a refusal and fails the replica's own
// vote requests, until the replica has applied what its leader had
// committed when it first heard from it. Without a vote record proving
// its term (proven false), the hold stays until the replica is rebuilt: a
// term it may have voted in is unknown.
//
// A replica that lost its stable store keeps the filter for as long as the
// process runs, held or not, and it counts and logs (INFO) every vote
// request it answers, with the term: the evidence that it never granted a
// vote while held, nor in a term at or below the one its record proves
// (Status: taskstore_raft_vote_answers_after_loss_total). Such replicas
// are rare, and so are elections: the log stays quiet otherwise, and the
// groups that lost nothing keep raft's transport unfiltered.
type voteHold struct {
	reason string
	proven bool
	log    *slog.Logger
	raft   atomic.Pointer[raft.Raft] // set once raft runs

	held   atomic.Bool
	target atomic.Uint64 // leader's commit index at first contact; 0: none yet
	done   chan struct{}

	provenTerm atomic.Uint64 // the vote term the record proved at start; 0: none
	// Vote requests answered since the start: granted, refused by raft,
	// refused by the hold.
	granted, refused, heldRefused atomic.Uint64
}

func newVoteHold(reason string, proven bool, log *slog.Logger) *voteHold {
	h := &voteHold{reason: reason, proven: proven, log: log, done: make(chan struct{})}
	h.held.Store(true)
	return h
}

// newVoteWatch is a voteHold that never holds: a shard's replica whose
// raft.db lost its term and vote and got them back from its record runs
// normally (its log is intact in the node log), and its vote answers are
// only counted and logged.
func newVoteWatch(reason string, log *slog.Logger) *voteHold {
	return &voteHold{reason: reason, proven: true, log: log, done: make(chan struct{})}
}

// VoteAnswers counts the vote requests the replica answered since it
// started after losing its stable store: granted, refused by raft, and
// refused because it was held (pre-votes included: raft asks for them
// before an election, and a held replica refuses those too).
func (h *voteHold) VoteAnswers() (granted, refused, held uint64) {
	if h == nil {
		return 0, 0, 0
	}
	return h.granted.Load(), h.refused.Load(), h.heldRefused.Load()
}

// answered records raft's answer to a vote request.
func (h *voteHold) answered(req *raft.RequestVoteRequest, resp raft.RPCResponse) {
	r, ok := resp.Response.(*raft.RequestVoteResponse)
	granted := ok && resp.Error == nil && r.Granted
	if granted {
		h.granted.Add(1)
	} else {
		h.refused.Add(1)
	}
	h.log.Info("answered a vote request after losing its stable store", "term", req.Term, "candidate", string(req.ID),
		"granted", granted, "held", false, "proven_vote_term", h.provenTerm.Load(), "leadership_transfer", req.LeadershipTransfer)
}

// Held reports why the replica does not vote, or "" when it does.
func (h *voteHold) Held() string {
	if h == nil || !h.held.Load() {
		return ""
	}
	if !h.proven {
		return h.reason + "; no record proves its term, so it does not vote until rebuilt"
	}
	if t := h.target.Load(); t != 0 {
		return fmt.Sprintf("%s; it does not vote until it has applied index %d, its leader's commit index when it came back", h.reason, t)
	}
	return h.reason + "; it does not vote until it has caught up with its leader"
}

// check lifts the hold once the replica caught up.
func (h *voteHold) check() {
	r := h.raft.Load()
	if !h.proven || !h.held.Load() || r == nil {
		return
	}
	if t := h.target.Load(); t != 0 && r.AppliedIndex() >= t {
		if h.held.CompareAndSwap(true, false) {
			h.log.Info("the replica caught up with its leader after losing its Raft log: it votes again", "applied", r.AppliedIndex(), "target", t)
		}
	}
}

// errVoteHeld fails the vote requests of a held replica.
var errVoteHeld = errors.New("this replica lost its Raft log and does not stand for election until it has caught up")

// filter passes the RPCs of in on, answering vote requests itself while
// the replica is held.
func (h *voteHold) filter(in <-chan raft.RPC) <-chan raft.RPC {
	out := make(chan raft.RPC)
	go func() {
		for {
			var rpc raft.RPC
			select {
			case rpc = <-in:
			case <-h.done:
				return
			}
			h.check()
			if h.held.Load() {
				switch req := rpc.Command.(type) {
				case *raft.RequestVoteRequest:
					h.heldRefused.Add(1)
					h.log.Info("answered a vote request after losing its stable store", "term", req.Term, "candidate", string(req.ID),
						"granted", false, "held", true, "proven_vote_term", h.provenTerm.Load(), "leadership_transfer", req.LeadershipTransfer)
					rpc.Respond(&raft.RequestVoteResponse{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax}, Term: req.Term}, nil)
					continue
				case *raft.RequestPreVoteRequest:
					h.heldRefused.Add(1)
					h.log.Info("answered a pre-vote request after losing its stable store", "term", req.Term, "candidate", string(req.ID),
						"granted", false, "held", true, "proven_vote_term", h.provenTerm.Load())
					rpc.Respond(&raft.RequestPreVoteResponse{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax}, Term: req.Term}, nil)
					continue
				case *raft.AppendEntriesRequest:
					if req.LeaderCommitIndex > 0 {
						h.target.CompareAndSwap(0, req.LeaderCommitIndex)
					}
				}
			} else if req, ok := rpc.Command.(*raft.RequestVoteRequest); ok {
				// See raft's answer: NetworkTransport waits on a channel
				// of one, so handing the answer on never blocks.
				orig, mine := rpc.RespChan, make(chan raft.RPCResponse, 1)
				rpc.RespChan = mine
				go func() {
					select {
					case resp := <-mine:
						h.answered(req, resp)
						orig <- resp
					case <-h.done:
					}
				}()
			}
			select {
			case out <- rpc:
			case <-h.done:
				return
			}
		}
	}()
	return out
}

func (h *voteHold) close() {
	if h != nil {
		close(h.done)
	}
}

// Consumer hands raft the transport's RPCs, through the hold when there is one.
func (t serialTransport) Consumer() <-chan raft.RPC {
	if t.hold == nil {
		return t.NetworkTransport.Consumer()
	}
	return t.hold.filter(t.NetworkTransport.Consumer())
}

// RequestVote fails while the replica is held: it must not lead.
func (t serialTransport) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	if t.hold.Held() != "" {
		return errVoteHeld
	}
	return t.NetworkTransport.RequestVote(id, target, args, resp)
}

// RequestPreVote fails while the replica is held.
func (t serialTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	if t.hold.Held() != "" {
		return errVoteHeld
	}
	return t.NetworkTransport.RequestPreVote(id, target, args, resp)
}
