/*
Package fsm is the replicated state machine of one Taskstore shard: tasks,
their indexes, exactly-once sessions, snapshots. Every replica of a shard runs
a Machine fed by hashicorp/raft; the rules below hold on every replica
because the machine is deterministic. docs/semantics.md says the same for
users.

# Rules

 1. Determinism. The machine reads no clock and no randomness, and its
    only I/O is its own state's: Persist and Restore stream snapshots, and
    on the on-disk store (fsm/ondisk, --state disk) an apply reads the
    engine and commits its changes as one batch with the entry's index; an
    engine error there panics, as an undecodable entry does (rule 11),
    since a replica that skipped a write would diverge. Time comes only from
    Command.now, stamped by the leader. Replicas that applied the same log
    hold the same state and have the same Digest, whichever store holds it.

 2. Time. The machine's clock is the largest Command.now it has seen; it
    never goes backwards. Every "now" inside a command (created, modified,
    lease ends, availability) is the clock after that update. OP_TICK only
    advances it.

 3. States. A task is available when at <= clock, claimed when it has a
    claimant and at > clock (at is then the lease's end), and delayed when it
    has no claimant and at > clock. An expired lease needs no action: the
    task is simply available, and claiming it again bumps its version.

 4. Versions. A task is addressed by (id, version). Every change, claims
    included, creates version+1; a reference to any other version fails as
    stale. So a task version is committed at most once.

 5. Groups. A queue's consistency group is its name up to the first '/'.
    A Modify names one group; tasks of other groups are out of its reach
    (a reference to one is "missing"), and its inserts and moves must stay
    in the group.

 6. Transactions. A Modify is all or nothing. It is evaluated in the order
    depends, deletes, changes, inserts, each against the state the earlier
    ones left, and every failure is collected: missing or stale references
    (per kind), an insert whose id exists (in any group before
    FormatGroupIDs, in its group after) or whose key exists in its queue, a change or delete of a task another claimant holds under
    an unexpired lease. If there is any, the Result is a Failure listing
    them all and nothing changes. A change that moves a task with a key into
    a queue where the key is taken fails with INSERT_DUPLICATE_KEY. Changes
    end the claim unless keep_claim; ending an unexpired claim with at == 0
    makes the task available at once.

 7. Claims. A Claim takes up to limit available tasks of its queues, best
    first across them (priority descending, at ascending, id ascending),
    and sets claimant, at = now + lease, claims+1, version+1. Claiming
    nothing is a success with no tasks. OP_MODIFY_CLAIM is a Modify whose
    claim part (Modify.claim, queues of the modify's group, the modify's
    claimant) claims exactly so right after the transaction commits, in
    the same entry (ModifyResult.claim); a failed transaction claims
    nothing. It has its own op so that an older binary refuses the entry
    instead of applying the transaction without the claim.

 8. Keys. A key is unique within its queue. An if_absent insert whose key
    is taken returns the holder (in ModifyResult.inserted, its index in
    coalesced) instead of failing. From FormatQueueControls, the key of a
    task inserted with a dedup window stays reserved for that long of log
    time after the task is deleted or purged (unless the same request
    gives the key to another task): an insert of it fails naming the
    deleted task, or with if_absent returns the deleted version.
    Reservations expire as the clock passes them, and are in snapshots and
    in the Digest when there are any.

 9. Purge drops a whole queue in one command and returns the count.

 10. Exactly once. A command with a client_id is answered once per
    (client_id, seq): the same seq again returns the stored result without
    applying (a Modify's claimed tasks included), marked Result.replayed so
    that counters count the request once; a lower seq fails with kind
    STALE_SEQUENCE. A claim that claimed nothing is not stored, so a waiting claim may re-propose its
    seq. Sessions are bounded (MaxSessions, least recently seen evicted,
    ties by client id) and expire SessionTTL of log time after they were
    last seen; they are part of snapshots and the Digest. Each command of an
    OP_BATCH has its own clock update and exactly-once handling.

 11. The log. Apply panics on an entry it cannot decode, including op codes
    it does not know: diverging replicas are worse than a crash. Op codes
    and proto fields are append-only, so old logs replay on new code.
    Apply does not enforce Limits (they may change between versions);
    Validate enforces them at the API edge, before proposing. Apply only
    refuses (with Failure.kind INVALID) shapes the state cannot hold.

 12. Snapshots. Snapshot copies task and session pointers under the lock
    (tasks are immutable; a change replaces the task); Persist streams the
    format described in fsm.proto with a CRC-32C trailer while Apply goes
    on. Restore reads and checks the whole stream before it replaces the
    state; a damaged or truncated stream is an error wrapping
    ErrCorruptSnapshot and changes nothing.

 13. Concurrency. Apply, ApplyBatch, Snapshot and Restore are called by
    raft on one goroutine and take the write lock; the read methods take the
    read lock and may run concurrently with them. OnAvailable is called on
    the applying goroutine after the lock is released. Results, tasks and
    values returned share memory with the state and must not be modified.

 14. Cost. Insert, change, delete and claim are O(log n) in the queue's
    size (a claim also pays one descent per priority whose best task is not
    yet due); each queue keeps one ordered index (claim order), and a new
    version of a task takes over its id-map slot instead of rewriting the
    map, which keeps a claim at a million tasks within reach of one at a
    thousand (BenchmarkClaim). Get is O(1) per id; Queues and NextAt cost one
    descent per priority in use (at most 256: past that, the oldest
    available age looks at the 256 highest, and NextAt answers no later than
    100 ms ahead); Digest sorts the whole state and is meant for tests.

 15. Checkpoints. After an entry that moves the clock into a new
    CheckpointEvery bucket (one minute of log time), the machine takes a
    view of the state right there (mid-batch if need be) and hashes it like
    Digest on another goroutine; Checkpoints lists the last 16 completed.
    Only the log decides where checkpoints fall, so replicas compare them
    at equal indexes to find one that diverged (cluster/DESIGN.md). In
    memory the view is a copy-on-write clone of the store's trees
    (memStore.view: a step per queue under the lock, not per task); Raft
    snapshots and backups take the same view.

 16. Formats. The state carries a format number (format.go) that some rules
    read, like the clock: from FormatGroupIDs on, a task id is unique per
    consistency group instead of per shard, so two groups on one shard may
    each hold id x; references reach their Modify's group only, and Get
    returns every match. OP_SET_FORMAT raises it, never lowers it; a binary
    that does not know the format refuses the entry (rule 11). The format
    is in snapshots (stream format 2 when above 0, which older binaries
    refuse) and in the Digest only when above 0, so format-0 digests are
    those of older binaries. The cluster raises it once every replica's
    binary applies it (cluster/DESIGN.md).

 17. Pause. OP_PAUSE pauses or resumes a queue by name, whether or not it
    holds tasks. A paused queue takes inserts and changes as before but no
    claim takes its tasks (a claim of several queues takes from the
    others); NextAt and Available leave it out, so waiting claims stay
    parked, and a resume wakes them (OnAvailable). Paused queues are in
    Queues (with no tasks, as a row of zeros), in snapshots (records after
    the sessions, counted in the header; older binaries refuse them) and in
    the Digest only when there is one.

 18. Limits. OP_LIMIT sets (or with 0 clears) a queue's concurrency limit:
    a claim takes at most the limit less the queue's tasks under an
    unexpired lease (by the machine's clock), so a claim of several queues
    takes from the others. A commit that ends a claim of a limited queue
    tells waiting claims (OnAvailable), as a lease running out does; NextAt
    leaves out a full queue and Available counts within the room left.
    Limits are kept like pauses: in Queues (MaxClaimed), snapshots (records
    after the paused queues) and the Digest when there is one.

 19. Schedules. OP_SCHEDULE puts (or removes) a periodic schedule keyed by
    its group and name; its next tick comes in the command, computed by the
    leader (package schedule), so no replica evaluates a cron expression or
    a time zone. OP_FIRE fires one tick: only when it names the tick the
    schedule waits for (next), which makes a tick fired twice apply once;
    it moves next to the command's next and, when asked, inserts one task
    NAME@TICK (ScheduleTaskID) into the schedule's queue. Schedules are in
    snapshots and in the Digest when there are any.

 20. Memory budget. From FormatMemoryBudget, a Modify whose command carries
    a budget (Command.budget: bytes and a per-task overhead, stamped by the
    leader) is refused with Failure.kind MEMORY_FULL when it
    would grow the shard's tasks past it: each task counts its id, key,
    value and error (taskSize) plus the overhead. A Modify that does not
    grow them (claims, commits, deletes, a delete with an insert as large)
    and purges always apply. The count is derived from the tasks, kept
    as they change, recounted when the format is raised, and is not in
    snapshots or the Digest; the on-disk store keeps it in its small
    record. A refusal is not remembered as a session's answer, like an
    empty claim, so a retry applies once there is room (budget.go).

 21. Failure kinds. Every failure the machine decides carries its kind
    (Failure.kind, an append-only enum), set where the failure is decided;
    the layers above decide by it (rpc maps kinds to gRPC codes in one
    place, the slot mover waits out SLOT_NEEDS_FORMAT), and the message is
    for people. A stored answer is replicated state: it is in snapshots and
    the Digest, and its size counts toward MaxSessionBytes, which decides
    evictions. A replica of a binary without kinds stores the answer
    without one, so storing it would make replicas of mixed versions hold
    different state: the kind is kept in a stored answer only from
    FormatFailureKinds on, and below it the stored copy has its kinds
    cleared (withoutKinds), byte for byte what the older binary stores. The
    answer to the request itself is not state and carries its kind at any
    format. An answer without a kind (stored below the format, or applied
    by an older leader) is classified by KindOf from the fields and the
    frozen message prefixes older binaries wrote: the one place that reads
    a failure's message.

 22. Headers. From FormatHeaders, an insert's headers (string pairs) are
    kept with the task; a change with headers replaces them all, one with
    clear_headers removes them, and any other change, claim or move keeps
    them. Validate bounds them (MaxHeaders, MaxHeaderBytes,
    MaxHeaderKeyBytes); Apply does not. They count in taskSize, are in
    snapshots (Task.headers), in the on-disk record (field 14) and in the
    Digest only for tasks that have them. Below the format they are
    ignored. The few fields most tasks leave unset (the dedup window, the
    headers) live in task.ext, so the task struct keeps its size class.
    From FormatInsertClaimant, AnswerBytes counts them (before it the
    answer bounds did not).

 23. Slot moves. From FormatSlotMoves, OP_SLOT steps move a hash slot
    (SlotOf of a group) between two shards, each step naming its move:
    FREEZE on the source, IMPORT (in chunks) and ACTIVATE on the target,
    DROP of the source's copy, a bounded number of tasks per entry; an
    abandoned move is undone by DROP on the target and UNFREEZE on the
    source (slots.go). A shard serves every slot it holds no slot state for;
    a command of a slot it does not serve (frozen, importing or gone) is
    refused with kind MOVED and Failure.moved, changes nothing and is not
    remembered as its session's answer, so its retry applies where the
    routing table says. A step that does not fit the slot's state or the
    move is refused whole (SLOT_REFUSED), below the format SLOT_NEEDS_FORMAT.
    Slot states are in snapshots and in the Digest when there are any; a
    session remembers its request's group, so a move carries the sessions
    of the slot's groups.

 24. Inserter. From FormatInsertClaimant, a task inserted available (at
    <= now) by a Modify that names a claimant keeps that claimant until a
    claim or a change replaces it. It claims nothing: rule 3 wants a future
    at. A delayed insert records none unless held (rule 8's held insert).
    A claim counts an expired lease (ClaimResult.expired_leases) only for
    a task with a claimant and claims > 0.

 25. Policies. From FormatPolicies, OP_POLICY sets (or with every rule
    zero clears) a queue's policy (policy.go). Its delivery limit: a claim
    that would take a task of the queue that was claimed max_claims times
    or more and still names its claimant (its last lease ran out without
    a commit; a change that ends a claim clears the claimant) moves it to
    the policy's dead-letter queue instead, in the same entry, and takes
    the next task: a new version available at the clock, claims 0, its
    last claimant, attempt, value and headers kept, an error saying why
    unless it had one, and the headers HeaderDeadLetterFrom and
    HeaderDeadLetterClaims (a key the dead-letter queue holds goes into
    HeaderDeadLetterKey). Each queue of a claim is walked in claim order up
    to what it may give (availableUnder), so a claim moves only the tasks
    it reaches. A dead-letter queue is of the queue's group and not the
    queue itself (checkPolicy; refused INVALID). Policies are kept like
    limits: in Queues (Policy), snapshots (records after the slot states,
    counted in the header; older binaries refuse them, as they refuse the
    format), the on-disk store's small record, slot moves and the Digest
    when there is one.

 26. Retention. From FormatRetention, a policy may have a retain (log
    time), and OP_EXPIRE (the leader's retention steps, cluster/retention.go)
    visits at most Expire.visit (and MaxExpireVisit) tasks of the queue in
    claim order from its cursor, deleting those created retain ago or more
    that are not under an unexpired lease (their keys reserved as by any
    delete), and answers where the next step starts, or done. Without a
    retain it does nothing and says done. Below the format a retain is
    refused and OP_EXPIRE deletes nothing; the Digest shows a retain only
    when set, so digests of policies without one are those of
    FormatPolicies.

 27. Rate. From FormatRate, a policy may have a rate: rate_interval (log
    time per task) and burst, a token bucket whose state is the log time
    at which it is full again (QueuePolicy.bucket_full_at, 0: full). At
    the clock it holds burst less one token for every rate_interval begun
    between the clock and that time (state.tokens). A claim (or a Modify's
    claim part) takes from the queue at most as many tasks as it holds, as
    it takes at most what a concurrency limit leaves; each task it takes
    moves the time on by rate_interval from max(it, clock) (state.spend),
    in the same entry. A task dead-lettered by rule 25 takes no token. So
    every replica decides by the entry's time stamp, never its own clock,
    and the bucket travels with the policy: snapshots, the on-disk small
    record, slot moves and the Digest (only when a rate is set, so that
    digests without one are those of FormatRetention). OP_POLICY keeps the
    bucket of a queue that had a rate (at most one new burst behind the
    clock) and ignores the command's bucket_full_at; it tells waiting
    claims to look again when it changes or removes a rate. NextAt answers
    no earlier than the time the bucket holds a token (tokenAt), Available
    counts no more than it holds, and ClaimFindsNothing answers true for a
    queue whose bucket is empty at max(now, clock): a claim of an empty
    bucket writes no entry. Below the format a rate is refused.
*/
package fsm
