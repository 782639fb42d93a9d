// Package limits holds the limits a client of Taskstore meets, in one
// place that clients, proxies and nodes all import without linking the
// node's engine (Raft, Pebble):
//
//   - Commands: what one request may carry (sizes of values and names,
//     operations per transaction, the claim limit, the lease). A node
//     checks them before it proposes anything (fsm.Validate), so nothing
//     over a limit reaches the log.
//   - Server: a server's (node's or proxy's) message sizes, concurrent
//     streams and per-client rate limit, and the gRPC options that enforce
//     them.
//
// What a message may weigh and how many things it may name are constants
// of the API contract in taskstorepb (MaxMessageBytes, MaxResponseBytes,
// MaxClaimQueues, MaxRequestIDs); docs/semantics.md ("Limits") lists them
// all.
package limits

import "time"

// Commands bound what a command may carry. The node enforces them at the
// API edge so that nothing over a limit reaches the log. A zero field means
// the field of DefaultCommands.
type Commands struct {
	MaxValueBytes int // default 1 MiB
	MaxNameBytes  int // queue names, keys, claimants, client ids; default 256
	MaxIDBytes    int // default 128
	MaxOps        int // inserts+changes+deletes+depends per Modify; default 1000
	MaxClaimLimit int // default 1000
	MaxLeaseNanos int64
	MaxErrBytes   int // default 4096
}

// DefaultCommands are the limits used for zero fields of a Commands.
var DefaultCommands = Commands{
	MaxValueBytes: 1 << 20,
	MaxNameBytes:  256,
	MaxIDBytes:    128,
	MaxOps:        1000,
	MaxClaimLimit: 1000,
	MaxLeaseNanos: int64(24 * time.Hour),
	MaxErrBytes:   4096,
}

// WithDefaults returns l with each zero field set to DefaultCommands'.
func (l Commands) WithDefaults() Commands {
	d := DefaultCommands
	if l.MaxValueBytes > 0 {
		d.MaxValueBytes = l.MaxValueBytes
	}
	if l.MaxNameBytes > 0 {
		d.MaxNameBytes = l.MaxNameBytes
	}
	if l.MaxIDBytes > 0 {
		d.MaxIDBytes = l.MaxIDBytes
	}
	if l.MaxOps > 0 {
		d.MaxOps = l.MaxOps
	}
	if l.MaxClaimLimit > 0 {
		d.MaxClaimLimit = l.MaxClaimLimit
	}
	if l.MaxLeaseNanos > 0 {
		d.MaxLeaseNanos = l.MaxLeaseNanos
	}
	if l.MaxErrBytes > 0 {
		d.MaxErrBytes = l.MaxErrBytes
	}
	return d
}
