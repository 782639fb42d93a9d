package ondisk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
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
	return readRecord(t, &t.sessions, &t.s.recentSessions, t.kbuf, true, decodeSession)
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
	if err := t.DeleteSession(client); err != nil {
		return err
	}
	k, rec := SessionKey(t.s.shard, client), s.encode()
	ok := SessionOrderKey(t.s.shard, s.LastSeen, client)
	s.sum, s.rec = nil, rec
	if t.unhashed == nil {
		t.unhashed = map[string]*Session{}
	}
	t.unhashed[string(k)] = s
	t.meta.digest.Add(ok[shardLen:], nil)
	if t.meta.sessions == 0 || t.sessionHead != nil && bytes.Compare(ok, t.sessionHead) < 0 {
		// Below every key left (none, or below a bound of them): the
		// oldest.
		t.sessionHead, t.sessionExact = ok, true
	}
	t.meta.sessions++
	t.meta.sessionBytes += SessionSize(client, s)
	if err := t.b.Set(k, rec, nil); err != nil {
		return err
	}
	t.rememberSession(k, s)
	return t.b.Set(ok, nil, nil)
}

// DeleteSession forgets client's record; it is not an error if there is
// none.
func (t *Txn) DeleteSession(client string) error {
	old, err := t.Session(client)
	if err != nil || old == nil {
		return err
	}
	k, ok := SessionKey(t.s.shard, client), SessionOrderKey(t.s.shard, old.LastSeen, client)
	switch {
	case t.unhashed[string(k)] == old:
		delete(t.unhashed, string(k)) // written by this transaction and not hashed yet
	case old.sum != nil:
		t.meta.digest.addSum(old.sum, true)
	default:
		t.meta.digest.Remove(k[shardLen:], old.encode())
	}
	t.meta.digest.Remove(ok[shardLen:], nil)
	if t.sessionExact && bytes.Equal(ok, t.sessionHead) {
		t.sessionExact = false // still a bound below the rest
	}
	t.meta.sessions--
	t.meta.sessionBytes -= SessionSize(client, old)
	if err := t.b.Delete(k, nil); err != nil {
		return err
	}
	t.rememberSession(k, nil)
	return t.b.Delete(ok, nil)
}

// SessionsSeenSince returns a time no session was last seen before: the
// oldest session's last-seen time or an earlier one, from what the
// transaction knows without a read (known false: it knows none, or there
// is no session). Expiry asks every command whether the oldest session is
// too old; the oldest is often the client whose command it is, whose
// touch leaves only a bound below the rest, and finding the oldest again
// is a seek over the order's tombstones (16% of the CPU of claim+delete
// with sessions).
func (t *Txn) SessionsSeenSince() (since int64, known bool) {
	if t.meta.sessions == 0 || t.sessionHead == nil {
		return 0, false
	}
	lastSeen, _, err := ParseSessionOrderKey(t.sessionHead)
	if err != nil {
		return 0, false // OldestSession reports it
	}
	return lastSeen, true
}

// OldestSession returns the least recently seen session (ties by client
// id), or "" when there is none.
func (t *Txn) OldestSession() (client string, lastSeen int64, err error) {
	if t.meta.sessions == 0 {
		return "", 0, nil
	}
	if t.sessionExact {
		lastSeen, client, err = ParseSessionOrderKey(t.sessionHead)
		if err != nil {
			return "", 0, fmt.Errorf("ondisk: shard %d: %w", t.s.shard, err)
		}
		return client, lastSeen, nil
	}
	lo := tableKey(t.s.shard, TableSessionOrder, 0)
	from := t.sessionHead
	if from == nil {
		from = lo
	}
	it, err := t.r.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: tableKey(t.s.shard, TableSessionOrder+1, 0)})
	if err != nil {
		return "", 0, err
	}
	defer it.Close()
	if !it.SeekGE(from) {
		return "", 0, it.Error()
	}
	// Everything below the first live key is gone: start there next time
	// (the tombstones of expired sessions, as for queue heads).
	t.sessionHead, t.sessionExact = bytes.Clone(it.Key()), true
	lastSeen, client, err = ParseSessionOrderKey(it.Key())
	if err != nil {
		return "", 0, fmt.Errorf("ondisk: shard %d: %w", t.s.shard, err)
	}
	return client, lastSeen, nil
}
