package ondisk

import (
	"crypto/sha256"
	"encoding/binary"
)

// What a shard's digest covers: the records that say what the state is,
// each keyed without the storage id (a replica that installed a snapshot
// holds the shard under the other of its two ids), and tasks with their
// queue's name instead of its number (numbers follow the order queues
// were created in, which an install does not repeat). The indexes (claim
// order, due order, unique keys) and queue records are derived from the
// tasks and are left out. So two replicas at the same index have the same
// digest however they got there: by applying the log, in any batches, or
// by installing a snapshot.

// shardLen is the storage id's length at the start of every key.
const shardLen = 4

// digestTask is a task's record as the digest sees it.
func digestTask(queue string, tk *Task) []byte { return appendDigestTask(nil, queue, tk) }

// appendDigestTask appends digestTask(queue, tk) to b.
func appendDigestTask(b []byte, queue string, tk *Task) []byte {
	b = binary.AppendUvarint(b, uint64(len(queue)))
	b = append(b, queue...)
	c := *tk
	c.Queue = 0
	return AppendTask(b, &c)
}

// Digest is an order-independent hash of a set of key-value records (a
// multiset hash, "AdHash"): the sum, lane by lane modulo 2^64, of each
// record's SHA-256. Adding and removing a record cost one hash each, so a
// replica keeps the digest of a state of a hundred million tasks current
// as it applies entries, and a checkpoint (fsm's divergence check) reads it
// instead of hashing the whole state. Equal sets give equal digests in any
// order of updates.
//
// It is meant for finding accidental divergence between replicas, not for
// resisting an adversary who chooses records.
type Digest [4]uint64

// Add counts the record k=v in.
func (d *Digest) Add(k, v []byte) { d.apply(k, v, false) }

// Remove takes the record k=v out; it must have been added.
func (d *Digest) Remove(k, v []byte) { d.apply(k, v, true) }

func (d *Digest) apply(k, v []byte, remove bool) {
	sum := recordSum(k, v)
	d.addSum(&sum, remove)
}

// recordSum is the hash of the record k=v that the digest adds.
func recordSum(k, v []byte) [32]byte {
	// One buffer and Sum256, not a hash.Hash: no allocation for the
	// records of most tasks (this runs for every record a command writes).
	var stack [512]byte
	b := binary.AppendUvarint(stack[:0], uint64(len(k)))
	b = append(b, k...)
	b = append(b, v...)
	return sha256.Sum256(b)
}

// addSum adds (or removes) a record by its recordSum.
func (d *Digest) addSum(sum *[32]byte, remove bool) {
	for i := range d {
		x := binary.BigEndian.Uint64(sum[8*i:])
		if remove {
			d[i] -= x
		} else {
			d[i] += x
		}
	}
}

// Bytes is the digest's fixed-size encoding.
func (d Digest) Bytes() [32]byte {
	var b [32]byte
	for i, x := range d {
		binary.BigEndian.PutUint64(b[8*i:], x)
	}
	return b
}

// DigestFromBytes decodes Bytes.
func DigestFromBytes(b [32]byte) Digest {
	var d Digest
	for i := range d {
		d[i] = binary.BigEndian.Uint64(b[8*i:])
	}
	return d
}
