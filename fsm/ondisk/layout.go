package ondisk

import (
	"encoding/binary"
	"errors"
	"math"
	"strings"
)

// Layout is the version of the layout below that this binary writes; the
// shard's record holds the version its range is in. Open upgrades a range
// of an older layout and refuses one of a newer.
//
//   - 1: the first.
//   - 2: no session order keys (TableSessionOrder): the order is rebuilt in
//     memory from the session records when a range opens.
//   - 3: claim and due keys are set once and deleted with a single delete
//     (commitSorted); the upgrade writes them anew over a range delete.
const Layout byte = 3

// Tables: the byte after the shard in every key.
const (
	// TableTask maps a task to its record: shard|'t'|len(id)|id|group.
	TableTask byte = 't'
	// TableClaim is a queue's claim order, the index a claim reads:
	// shard|'c'|queue(4)|priority(4, descending)|at(8)|id, no value.
	TableClaim byte = 'c'
	// TableDue holds the tasks whose at is in the future, in at order, so
	// that advancing the clock finds those that came due:
	// shard|'d'|at(8)|queue(4)|id, no value.
	TableDue byte = 'd'
	// TableKey maps a queue's unique key to the id holding it:
	// shard|'k'|queue(4)|key → id.
	TableKey byte = 'k'
	// TableQueue maps a queue name to its number and counters:
	// shard|'q'|name → QueueRecord.
	TableQueue byte = 'q'
	// TableMeta holds the shard's applied index, clock, digest and next
	// queue number: shard|'m'|name.
	TableMeta byte = 'm'
	// TableSession holds each client's exactly-once record (its last
	// request's sequence number, when it was last seen, the answer):
	// shard|'s'|client id → SessionRecord.
	TableSession byte = 's'
	// TableSessionOrder ordered the sessions least recently seen first, for
	// expiry and eviction: shard|'o'|last seen(8)|client id, no value.
	// Layout 1 only (the order is in memory since); the digest still
	// covers each session's order key, as if it were written.
	TableSessionOrder byte = 'o'
	// TableReservation holds the keys that deleted tasks keep taken for
	// their dedup window: shard|'r'|len(queue)|queue|key → Reservation.
	// By queue name, not number: a reservation outlives its queue's tasks.
	TableReservation byte = 'r'
	// TableReservationOrder orders the reservations by their end:
	// shard|'u'|until(8)|len(queue)|queue|key, no value.
	TableReservationOrder byte = 'u'
)

// ShardPrefix is the first key of a shard's range; ShardEnd is the first
// key after it.
func ShardPrefix(shard uint32) []byte { return binary.BigEndian.AppendUint32(nil, shard) }

// ShardEnd is the exclusive upper bound of a shard's range.
func ShardEnd(shard uint32) []byte {
	if shard == math.MaxUint32 {
		return []byte{0xff, 0xff, 0xff, 0xff, 0xff}
	}
	return binary.BigEndian.AppendUint32(nil, shard+1)
}

func tableKey(shard uint32, table byte, n int) []byte {
	return appendTableKey(make([]byte, 0, 5+n), shard, table)
}

// appendTableKey appends a key's shard and table to dst: the append forms
// of the keys below build a key in a transaction's buffer where the key
// is not kept (the batch copies what it is given).
func appendTableKey(dst []byte, shard uint32, table byte) []byte {
	return append(binary.BigEndian.AppendUint32(dst, shard), table)
}

// TaskKey is the key of a task's record: the id, length-prefixed, then
// the task's consistency group. Ids are unique per group
// (fsm.FormatGroupIDs), and the tasks of every group with one id share the
// prefix TaskIDPrefix, so a lookup by id alone is one short range read.
func TaskKey(shard uint32, group, id string) []byte {
	return append(taskIDPrefix(shard, id, len(group)), group...)
}

// TaskIDPrefix is the prefix of the keys of every group's task with id.
func TaskIDPrefix(shard uint32, id string) []byte { return taskIDPrefix(shard, id, 0) }

func taskIDPrefix(shard uint32, id string, extra int) []byte {
	b := binary.AppendUvarint(tableKey(shard, TableTask, binary.MaxVarintLen64+len(id)+extra), uint64(len(id)))
	return append(b, id...)
}

// appendTaskKey is TaskKey appended to dst.
func appendTaskKey(dst []byte, shard uint32, group, id string) []byte {
	b := binary.AppendUvarint(appendTableKey(dst, shard, TableTask), uint64(len(id)))
	return append(append(b, id...), group...)
}

// GroupOf is a queue's consistency group: its name up to the first '/'
// (fsm.GroupOf; this package is below fsm).
func GroupOf(queue string) string {
	if i := strings.IndexByte(queue, '/'); i >= 0 {
		return queue[:i]
	}
	return queue
}

// ClaimPrefix is the first key of a queue's claim order; ClaimPriority
// narrows it to one priority.
func ClaimPrefix(shard, queue uint32) []byte {
	return binary.BigEndian.AppendUint32(tableKey(shard, TableClaim, 4), queue)
}

// ClaimPriority is the first key of one priority of a queue's claim order.
func ClaimPriority(shard, queue uint32, priority int32) []byte {
	return binary.BigEndian.AppendUint32(ClaimPrefix(shard, queue), descending(priority))
}

// ClaimKey is a task's key in its queue's claim order: priority
// descending, then at ascending, then id.
func ClaimKey(shard, queue uint32, priority int32, at int64, id string) []byte {
	b := ClaimPriority(shard, queue, priority)
	b = binary.BigEndian.AppendUint64(b, ascending(at))
	return append(b, id...)
}

// appendClaimKey is ClaimKey appended to dst.
func appendClaimKey(dst []byte, shard, queue uint32, priority int32, at int64, id string) []byte {
	b := binary.BigEndian.AppendUint32(appendTableKey(dst, shard, TableClaim), queue)
	b = binary.BigEndian.AppendUint32(b, descending(priority))
	b = binary.BigEndian.AppendUint64(b, ascending(at))
	return append(b, id...)
}

// ParseClaimKey splits a claim key.
func ParseClaimKey(k []byte) (shard, queue uint32, priority int32, at int64, id string, err error) {
	if len(k) < 5+4+4+8 || k[4] != TableClaim {
		return 0, 0, 0, 0, "", errors.New("ondisk: not a claim key")
	}
	shard = binary.BigEndian.Uint32(k)
	queue = binary.BigEndian.Uint32(k[5:])
	priority = int32(^binary.BigEndian.Uint32(k[9:]) ^ 1<<31)
	at = int64(binary.BigEndian.Uint64(k[13:]) ^ 1<<63)
	return shard, queue, priority, at, string(k[21:]), nil
}

// DueKey is a task's key in the due-time index.
func DueKey(shard uint32, at int64, queue uint32, id string) []byte {
	b := tableKey(shard, TableDue, 12+len(id))
	b = binary.BigEndian.AppendUint64(b, ascending(at))
	b = binary.BigEndian.AppendUint32(b, queue)
	return append(b, id...)
}

// appendDueKey is DueKey appended to dst.
func appendDueKey(dst []byte, shard uint32, at int64, queue uint32, id string) []byte {
	b := binary.BigEndian.AppendUint64(appendTableKey(dst, shard, TableDue), ascending(at))
	b = binary.BigEndian.AppendUint32(b, queue)
	return append(b, id...)
}

// ParseDueKey splits a due-time key.
func ParseDueKey(k []byte) (shard uint32, at int64, queue uint32, id string, err error) {
	if len(k) < 5+8+4 || k[4] != TableDue {
		return 0, 0, 0, "", errors.New("ondisk: not a due key")
	}
	return binary.BigEndian.Uint32(k), int64(binary.BigEndian.Uint64(k[5:]) ^ 1<<63),
		binary.BigEndian.Uint32(k[13:]), string(k[17:]), nil
}

// UniqueKey is the key of a queue's unique key.
func UniqueKey(shard, queue uint32, key string) []byte {
	b := binary.BigEndian.AppendUint32(tableKey(shard, TableKey, 4+len(key)), queue)
	return append(b, key...)
}

// QueueKey is the key of a queue's record.
func QueueKey(shard uint32, name string) []byte {
	return append(tableKey(shard, TableQueue, len(name)), name...)
}

// SessionKey is the key of a client's exactly-once record.
func SessionKey(shard uint32, client string) []byte {
	return append(tableKey(shard, TableSession, len(client)), client...)
}

// appendSessionKey is SessionKey appended to dst.
func appendSessionKey(dst []byte, shard uint32, client string) []byte {
	return append(appendTableKey(dst, shard, TableSession), client...)
}

// SessionOrderKey is a session's key in least-recently-seen order.
func SessionOrderKey(shard uint32, lastSeen int64, client string) []byte {
	b := binary.BigEndian.AppendUint64(tableKey(shard, TableSessionOrder, 8+len(client)), ascending(lastSeen))
	return append(b, client...)
}

// ParseSessionOrderKey splits a session order key.
func ParseSessionOrderKey(k []byte) (lastSeen int64, client string, err error) {
	if len(k) < 5+8 || k[4] != TableSessionOrder {
		return 0, "", errors.New("ondisk: not a session order key")
	}
	return int64(binary.BigEndian.Uint64(k[5:]) ^ 1<<63), string(k[13:]), nil
}

// MetaKey is the key of one of the shard's own values.
func MetaKey(shard uint32, name string) []byte {
	return append(tableKey(shard, TableMeta, len(name)), name...)
}

// ascending maps an int64 to a uint64 whose big-endian bytes sort as the
// signed value does.
func ascending(v int64) uint64 { return uint64(v) ^ 1<<63 }

// descending maps an int32 to a uint32 whose big-endian bytes sort in the
// opposite order of the signed value (higher priority first).
func descending(p int32) uint32 { return ^(uint32(p) ^ 1<<31) }

// ReservationKey is the key of a queue's key reservation.
func ReservationKey(shard uint32, queue, key string) []byte {
	b := binary.AppendUvarint(tableKey(shard, TableReservation, binary.MaxVarintLen64+len(queue)+len(key)), uint64(len(queue)))
	b = append(b, queue...)
	return append(b, key...)
}

// ReservationOrderKey is a reservation's key in order of its end, then
// queue, then key (fsm orders its reservations so, and a snapshot lists
// them in this order): the queue is escaped and terminated so that the
// bytes sort as the (queue, key) pairs do.
func ReservationOrderKey(shard uint32, until int64, queue, key string) []byte {
	b := binary.BigEndian.AppendUint64(tableKey(shard, TableReservationOrder, 8+2*len(queue)+2+len(key)), ascending(until))
	for i := 0; i < len(queue); i++ {
		b = append(b, queue[i])
		if queue[i] == 0 {
			b = append(b, 0xff)
		}
	}
	b = append(b, 0, 1)
	return append(b, key...)
}

// ParseReservationOrderKey splits a reservation order key.
func ParseReservationOrderKey(k []byte) (until int64, queue, key string, err error) {
	if len(k) < 5+8+2 || k[4] != TableReservationOrder {
		return 0, "", "", errors.New("ondisk: not a reservation order key")
	}
	until = int64(binary.BigEndian.Uint64(k[5:]) ^ 1<<63)
	var q []byte
	for i := 13; i+1 < len(k); i++ {
		switch {
		case k[i] != 0:
			q = append(q, k[i])
		case k[i+1] == 0xff:
			q = append(q, 0)
			i++
		case k[i+1] == 1:
			return until, string(q), string(k[i+2:]), nil
		default:
			return 0, "", "", errors.New("ondisk: bad reservation order key")
		}
	}
	return 0, "", "", errors.New("ondisk: bad reservation order key")
}
