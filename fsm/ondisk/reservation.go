package ondisk

import (
	"encoding/binary"
	"errors"

	"github.com/cockroachdb/pebble/v2"
)

// Reservation keeps a deleted task's key taken in its queue until Until
// (log time): Task is the version deleted (its Queue number is not kept:
// the queue is in the key).
type Reservation struct {
	Until int64
	ID    string // the deleted task's id
	Task  *Task
}

func (r *Reservation) encode() []byte {
	b := binary.AppendVarint(nil, r.Until)
	b = binary.AppendUvarint(b, uint64(len(r.ID)))
	b = append(b, r.ID...)
	tk := *r.Task
	tk.Queue = 0
	return AppendTask(b, &tk)
}

func decodeReservation(b []byte) (*Reservation, error) {
	until, n := binary.Varint(b)
	if n <= 0 {
		return nil, errors.New("ondisk: bad reservation record")
	}
	b = b[n:]
	idLen, n := binary.Uvarint(b)
	if n <= 0 || uint64(len(b)-n) < idLen {
		return nil, errors.New("ondisk: bad reservation record")
	}
	id := string(b[n : n+int(idLen)])
	tk, err := DecodeTask(b[n+int(idLen):])
	if err != nil {
		return nil, err
	}
	return &Reservation{Until: until, ID: id, Task: tk}, nil
}

// Reservation returns the reservation of key in queue, or nil.
func (t *Txn) Reservation(queue, key string) (*Reservation, error) {
	v, c, err := t.r.Get(ReservationKey(t.s.shard, queue, key))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return decodeReservation(v)
}

// PutReservation stores the reservation of key in queue, replacing an
// earlier one.
func (t *Txn) PutReservation(queue, key string, r *Reservation) error {
	if err := t.DeleteReservation(queue, key); err != nil {
		return err
	}
	k, rec := ReservationKey(t.s.shard, queue, key), r.encode()
	ok := ReservationOrderKey(t.s.shard, r.Until, queue, key)
	t.meta.digest.Add(k[shardLen:], rec)
	t.meta.digest.Add(ok[shardLen:], nil)
	t.meta.reservations++
	if err := t.b.Set(k, rec, nil); err != nil {
		return err
	}
	return t.b.Set(ok, nil, nil)
}

// DeleteReservation removes the reservation of key in queue; it is not an
// error if there is none.
func (t *Txn) DeleteReservation(queue, key string) error {
	old, err := t.Reservation(queue, key)
	if err != nil || old == nil {
		return err
	}
	k, ok := ReservationKey(t.s.shard, queue, key), ReservationOrderKey(t.s.shard, old.Until, queue, key)
	t.meta.digest.Remove(k[shardLen:], old.encode())
	t.meta.digest.Remove(ok[shardLen:], nil)
	t.meta.reservations--
	if err := t.b.Delete(k, nil); err != nil {
		return err
	}
	return t.b.Delete(ok, nil)
}

// Reservations is how many key reservations the transaction sees.
func (t *Txn) Reservations() uint64 { return t.meta.reservations }

// AscendReservations calls fn with the reservations, soonest end first
// (then by queue and key), while fn returns true. fn may not change the
// transaction.
func (t *Txn) AscendReservations(fn func(queue, key string, r *Reservation) bool) error {
	it, err := t.r.NewIter(&pebble.IterOptions{LowerBound: tableKey(t.s.shard, TableReservationOrder, 0), UpperBound: tableKey(t.s.shard, TableReservationOrder+1, 0)})
	if err != nil {
		return err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		_, queue, key, err := ParseReservationOrderKey(it.Key())
		if err != nil {
			return err
		}
		r, err := t.Reservation(queue, key)
		if err != nil {
			return err
		}
		if r == nil {
			return errors.New("ondisk: a reservation order key without its reservation")
		}
		if !fn(queue, key, r) {
			return nil
		}
	}
	return it.Error()
}
