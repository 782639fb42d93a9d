package taskstorepb

// Message size limits shared by servers (nodes, proxies) and clients, so
// that a request a client is willing to send is one a server is willing to
// read, and an answer a server sends is one a client is willing to receive.
// Over either limit gRPC itself answers ResourceExhausted, before any
// handler runs (a client refuses to send an oversized request at all).
//
// How they relate to the command limits (limits.DefaultCommands):
//
//   - A value is at most 1 MiB, an error text 4 KiB, a queue name or key 256
//     bytes, an id 128 bytes, and a transaction has at most 1000 operations.
//     One operation with every field but the value at its limit is about
//     4.8 KB, so a transaction of 1000 such operations is about 4.8 MB, and
//     MaxMessageBytes leaves room for that plus one value at its limit, or
//     for seven values at the limit with ordinary metadata (rpc's limits
//     test checks this). Larger batches must be split by the caller, as they
//     would be over MaxOps anyway.
//   - MaxMessageBytes also bounds a Raft log entry: a command is the request
//     re-encoded, with leader-chosen ids and timestamps added.
//   - The answer to a Modify echoes the inserted and changed tasks with their
//     values, so it is up to MaxOps × (id, version, timestamps) larger than
//     the request: MaxResponseBytes must exceed MaxMessageBytes by more than
//     that (a few hundred KB), or a committed write could not be answered.
//     It is 8× larger, which also carries a Tasks page or a Claim of about
//     63 values at the limit. A claim takes no more tasks than its answer
//     can carry, and a transaction whose echo would not fit (changes echo
//     the values they keep) is refused before it commits (Claim.max_bytes,
//     Modify.max_answer_bytes in fsm/fsmpb; docs/semantics.md). A Tasks
//     page whose values add up to more fails with ResourceExhausted: ask
//     for fewer tasks, or omit_values.
//
// Each limit has one name (docs/semantics.md, "Limits"): what a message may
// weigh and how many things it may name are here, in the API contract;
// what a command may carry (sizes of values and names, operations per
// transaction, the claim limit, the lease) is limits.Commands (api/limits),
// which a node enforces before proposing (limits.Server.Commands configures
// it); limits.Server holds a server's configurable instances of these and
// its rate limits.
const (
	// MaxClaimQueues is the most queues one Claim (or a Modify's claim) may
	// name. A claim, and every retry of a waiting claim, is a log entry
	// carrying the names. Over it: ResourceExhausted.
	MaxClaimQueues = 1000
	// MaxRequestIDs is the most ids one Tasks request may name. Over it:
	// ResourceExhausted.
	MaxRequestIDs = 1000
	// MaxMessageBytes is the largest request a server reads and a client
	// sends: 8 MiB.
	MaxMessageBytes = 8 << 20
	// MaxResponseBytes is the largest answer a server sends and a client
	// receives: 64 MiB.
	MaxResponseBytes = 64 << 20
)
