package ondisk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/btree"
)

// Session is a client's exactly-once record: the sequence number of its
// last request, when it was last seen (log time), and the encoded answer
// (fsmpb.Result) a repeat of that request gets.
type Session struct {
	Seq      uint64
	LastSeen int64
	Result   []byte
	// Group is the request's consistency group (fsm.FormatSlotMoves on).
	Group string
	// sum, when set: the record's hash in the digest (PutSession), so that
	// replacing it, which every command of the client does, does not
	// encode and hash the old answer again.
	sum *[32]byte
	// rec: the record as written, until Commit hashes it into the digest
	// (a record replaced within its transaction, as a command's touch is
	// by its answer, is never hashed).
	rec []byte
}

// SessionOverheadBytes is what a session counts for besides its client id
// and answer, as fsm counts it against MaxSessionBytes.
const SessionOverheadBytes = 64

// SessionSize is what a session counts for against the shard's bound.
func SessionSize(client string, s *Session) uint64 {
	return uint64(len(client)+len(s.Result)) + SessionOverheadBytes
}

func (s *Session) encode() []byte {
	b := binary.AppendUvarint(nil, s.Seq)
	b = binary.AppendVarint(b, s.LastSeen)
	b = binary.AppendUvarint(b, uint64(len(s.Group)))
	b = append(b, s.Group...)
	return append(b, s.Result...)
}

func decodeSession(b []byte) (*Session, error) {
	seq, n := binary.Uvarint(b)
	if n <= 0 {
		return nil, errors.New("ondisk: bad session record")
	}
	b = b[n:]
	seen, n := binary.Varint(b)
	if n <= 0 {
		return nil, errors.New("ondisk: bad session record")
	}
	b = b[n:]
	glen, n := binary.Uvarint(b)
	if n <= 0 || uint64(len(b)-n) < glen {
		return nil, errors.New("ondisk: bad session record")
	}
	group := string(b[n : n+int(glen)])
	return &Session{Seq: seq, LastSeen: seen, Group: group, Result: bytes.Clone(b[n+int(glen):])}, nil
}

// Sessions is how many sessions the shard holds and their total size
// (SessionSize), the two bounds fsm evicts by.
func (s *State) Sessions() (count, size uint64) { return s.meta.sessions, s.meta.sessionBytes }

// Sessions is the transaction's view of Sessions.
func (t *Txn) Sessions() (count, size uint64) { return t.meta.sessions, t.meta.sessionBytes }

// Session returns client's record, or nil.
func (t *Txn) Session(client string) (*Session, error) {
	t.kbuf = appendSessionKey(t.kbuf[:0], t.s.shard, client)
	var deferred map[string][]byte
	if !t.view && !t.own {
		// Only the apply reads the State's written-back sessions: a view
		// runs beside commits that write them, and a read put them into
		// the engine before it began.
		deferred = t.s.deferred.sessions
	}
	return readRecord(t, &t.sessions, &t.s.recentSessions, deferred, t.kbuf, true, decodeSession)
}

// hashSessions adds the sessions the transaction wrote and kept to the
// digest (Commit, and a view of it: Digest).
func (t *Txn) hashSessions() {
	for k, s := range t.unhashed {
		sum := recordSum([]byte(k)[shardLen:], s.rec)
		t.meta.digest.addSum(&sum, false)
		s.sum, s.rec = &sum, nil
	}
	clear(t.unhashed)
}

// rememberSession records what the session at k is now (nil: none).
func (t *Txn) rememberSession(k []byte, s *Session) { rememberIn(&t.sessions, k, s) }

// PutSession stores client's record, replacing its earlier one.
func (t *Txn) PutSession(client string, s *Session) error {
	if _, err := t.forgetSession(client); err != nil {
		return err
	}
	k, rec := SessionKey(t.s.shard, client), s.encode()
	s.sum, s.rec = nil, rec
	if t.unhashed == nil {
		t.unhashed = map[string]*Session{}
	}
	t.unhashed[string(k)] = s
	// The order is in memory (layout 2), but the digest covers it as the
	// order key it was, so that it stays the same for every layout.
	t.meta.digest.Add(SessionOrderKey(t.s.shard, s.LastSeen, client)[shardLen:], nil)
	t.orderForWrite().ReplaceOrInsert(sessionAt{seen: s.LastSeen, client: client})
	t.meta.sessions++
	t.meta.sessionBytes += SessionSize(client, s)
	t.writeSession(k, rec)
	t.rememberSession(k, s)
	return nil
}

// writeSession records that the session record at k is now rec (nil:
// deleted). Sessions are written back, not through the pending batch:
// every command of a client replaces its record, so Commit leaves the
// last in the State's deferred records and commitPending writes it
// (deferred.go).
func (t *Txn) writeSession(k, rec []byte) {
	if t.sessionWrites == nil {
		t.sessionWrites = map[string][]byte{}
	}
	t.sessionWrites[string(k)] = rec
}

// DeleteSession forgets client's record; it is not an error if there is
// none.
func (t *Txn) DeleteSession(client string) error {
	k, err := t.forgetSession(client)
	if err != nil || k == nil {
		return err
	}
	t.writeSession(k, nil)
	t.rememberSession(k, nil)
	return nil
}

// forgetSession takes client's record, if there is one, out of the
// session counts, the order and the digest, and returns its key (nil:
// there is none); the caller writes what replaces the record.
func (t *Txn) forgetSession(client string) ([]byte, error) {
	old, err := t.Session(client)
	if err != nil || old == nil {
		return nil, err
	}
	k := SessionKey(t.s.shard, client)
	switch {
	case t.unhashed[string(k)] == old:
		delete(t.unhashed, string(k)) // written by this transaction and not hashed yet
	case old.sum != nil:
		t.meta.digest.addSum(old.sum, true)
	default:
		t.meta.digest.Remove(k[shardLen:], old.encode())
	}
	t.meta.digest.Remove(SessionOrderKey(t.s.shard, old.LastSeen, client)[shardLen:], nil)
	t.orderForWrite().Delete(sessionAt{seen: old.LastSeen, client: client})
	t.meta.sessions--
	t.meta.sessionBytes -= SessionSize(client, old)
	return k, nil
}

// SessionsSeenSince returns a time no session was last seen before: the
// oldest session's last-seen time (known false: there is no session).
// Expiry asks every command whether the oldest session is too old.
func (t *Txn) SessionsSeenSince() (since int64, known bool) {
	o, ok := t.order.Min()
	return o.seen, ok
}

// OldestSession returns the least recently seen session (ties by client
// id), or "" when there is none.
func (t *Txn) OldestSession() (client string, lastSeen int64, err error) {
	o, _ := t.order.Min()
	return o.client, o.seen, nil
}

// sessionAt is a session's place in the order of last-seen times, ties by
// client id: the order eviction and expiry take sessions in, kept in
// memory (a few tens of bytes per session, bounded by fsm's MaxSessions)
// rather than as an order key per session, which every command of a
// client deleted and wrote again (DESIGN.md, "Writes a command makes").
type sessionAt struct {
	seen   int64
	client string
}

func sessionLess(a, b sessionAt) bool {
	if a.seen != b.seen {
		return a.seen < b.seen
	}
	return a.client < b.client
}

// orderDegree is the order's B-tree degree.
const orderDegree = 16

func newSessionOrder() *btree.BTreeG[sessionAt] { return btree.NewG(orderDegree, sessionLess) }

// orderForWrite returns the transaction's own copy of the session order,
// made at its first change (a copy-on-write clone: the State's, and a
// view's, stay as they are until Commit installs it).
func (t *Txn) orderForWrite() *btree.BTreeG[sessionAt] {
	if !t.orderMine {
		t.order, t.orderMine = t.order.Clone(), true
	}
	return t.order
}

// loadSessionOrder builds the order from the session records (Open).
func (s *State) loadSessionOrder() error {
	s.order = newSessionOrder()
	lo := SessionKey(s.shard, "")
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: tableKey(s.shard, TableSession+1, 0)})
	if err != nil {
		return err
	}
	for it.First(); it.Valid(); it.Next() {
		seen, err := sessionLastSeen(it.Value())
		if err != nil {
			it.Close()
			return fmt.Errorf("ondisk: shard %d: session %q: %w", s.shard, it.Key()[len(lo):], err)
		}
		s.order.ReplaceOrInsert(sessionAt{seen: seen, client: string(it.Key()[len(lo):])})
	}
	return it.Close()
}

// sessionLastSeen reads a session record's last-seen time only.
func sessionLastSeen(b []byte) (int64, error) {
	_, n := binary.Uvarint(b)
	if n <= 0 {
		return 0, errors.New("ondisk: bad session record")
	}
	seen, m := binary.Varint(b[n:])
	if m <= 0 {
		return 0, errors.New("ondisk: bad session record")
	}
	return seen, nil
}
