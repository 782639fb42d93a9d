package cluster

import (
	"strconv"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/e1158ecb/taskstore/cluster/control"
	"github.com/e1158ecb/taskstore/fsm"
)

// MaxQueueSeries caps how many queues get their own taskstore_queue_*
// series per node; the rest are summed per group as "<group>/*", because a
// cluster may hold 100k queues.
const MaxQueueSeries = 500

// nodeMetrics are the node's own timers and counters. hashicorp/raft's
// metrics carry no group label, so per-shard figures come from here and from
// Stats() at scrape time (collector below).
type nodeMetrics struct {
	applySeconds    *prometheus.HistogramVec
	snapshotSeconds *prometheus.HistogramVec
	leaderChanges   *prometheus.CounterVec
	logSyncs        prometheus.Counter
	logSyncEntries  prometheus.Histogram
	logBytes        prometheus.Counter
	clockOffset     prometheus.Gauge
	diskFree        prometheus.Gauge
	diskLow         prometheus.Gauge
	scheduleTicks   *prometheus.CounterVec
	movesFinished   *prometheus.CounterVec
	// proposedRequests, proposedEntries: commands a shard's leader
	// proposed and the entries that carried them (coalesce.go).
	proposedRequests *prometheus.CounterVec
	proposedEntries  *prometheus.CounterVec
	// emptyClaims: claims the leader answered empty with no log entry.
	emptyClaims *prometheus.CounterVec
}

func newNodeMetrics(reg prometheus.Registerer, n *Node) *nodeMetrics {
	m := &nodeMetrics{
		applySeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "taskstore_shard_apply_seconds",
			Help:    "Time from proposing a command on the shard leader to its result (commit on a quorum, fsync, apply), once per command: commands that share a log entry count once each.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}, []string{"shard"}),
		snapshotSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "taskstore_shard_snapshot_seconds",
			Help:    "Time to write a shard snapshot to disk.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"shard"}),
		leaderChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "taskstore_shard_leader_changes_total",
			Help: "Times this node became leader of the shard.",
		}, []string{"shard"}),
		logSyncs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "taskstore_log_syncs_total",
			Help: "fdatasync and fsync calls the node made for its shared Raft log (nodelog): one per write batch, plus directory syncs. The meta group's and the groups' term/vote files (raft-boltdb) are not counted.",
		}),
		logSyncEntries: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "taskstore_log_append_entries",
			Help:    "Raft entries made durable by one fdatasync of the shared Raft log, from all the node's shards together (group commit).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
		logBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "taskstore_log_bytes_written_total",
			Help: "Bytes the node wrote to its shared Raft log.",
		}),
		clockOffset: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "taskstore_clock_offset_seconds",
			Help: "Median offset of this node's clock from its peers' (this minus theirs), as last measured. Beyond the maximum offset (500 ms by default) from most peers the node refuses to lead.",
		}),
		diskFree: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "taskstore_disk_free_bytes",
			Help: "Free bytes of the file system holding the node's data directory, as last measured.",
		}),
		scheduleTicks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "taskstore_schedule_ticks_total",
			Help: "Schedule ticks this node fired as a shard's leader: inserted (a task), skipped (missed while the shard had no leader, the schedule skips missed ticks), duplicate (fired already, by an earlier leader's proposal: nothing inserted twice), or failed (the proposal failed; the tick is fired again).",
		}, []string{"result"}),
		diskLow: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "taskstore_disk_low",
			Help: "1 while the data directory's free space is below the node's reserve (--min-free-disk, 256 MiB by default): the node refuses to lead and hands its leaderships away; free space or grow the volume.",
		}),
	}
	m.proposedRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "taskstore_shard_proposed_requests_total",
		Help: "Commands this node proposed as the shard's leader (client writes, ticks, schedule firings, format and slot steps), once per proposal: a waiting claim that proposes again counts again.",
	}, []string{"shard"})
	m.proposedEntries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "taskstore_shard_proposed_entries_total",
		Help: "Raft log entries that carried the commands of taskstore_shard_proposed_requests_total: client writes that arrive while the shard's previous entry of writes is in flight share the next one (requests per entry = their ratio).",
	}, []string{"shard"})
	m.emptyClaims = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "taskstore_shard_empty_claims_total",
		Help: "Claims this node, as the shard's leader, answered empty from its applied state after confirming its leadership (a heartbeat round), without a log entry: nothing was available in their queues. A waiting claim counts once per look.",
	}, []string{"shard"})
	m.movesFinished = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "taskstore_slot_moves_finished_total",
		Help: "On the meta leader: slot moves this node finished, by outcome (done: the slot is on its target; aborted: undone, the slot stayed).",
	}, []string{"outcome"})
	if reg != nil {
		reg.MustRegister(m.applySeconds, m.snapshotSeconds, m.leaderChanges, m.logSyncs, m.logSyncEntries, m.logBytes, m.clockOffset,
			m.diskFree, m.diskLow, m.scheduleTicks, m.movesFinished, m.proposedRequests, m.proposedEntries, m.emptyClaims, &shardCollector{n: n})
	}
	return m
}

// observeSync counts one fdatasync of the node log (nodelog.Options.OnSync).
func (m *nodeMetrics) observeSync(entries, bytes int) {
	m.logSyncs.Inc()
	m.logBytes.Add(float64(bytes))
	if entries > 0 {
		m.logSyncEntries.Observe(float64(entries))
	}
}

func shardLabel(id uint32) string { return strconv.FormatUint(uint64(id), 10) }

var (
	descLeader      = prometheus.NewDesc("taskstore_shard_leader", "1 if this node leads the shard (ready for reads and writes), else 0.", []string{"shard"}, nil)
	descTerm        = prometheus.NewDesc("taskstore_shard_term", "Current Raft term of the shard on this node.", []string{"shard"}, nil)
	descCommit      = prometheus.NewDesc("taskstore_shard_commit_index", "Raft commit index of the shard on this node.", []string{"shard"}, nil)
	descApplied     = prometheus.NewDesc("taskstore_shard_applied_index", "Raft applied index of the shard on this node.", []string{"shard"}, nil)
	descLogBytes    = prometheus.NewDesc("taskstore_shard_log_bytes", "Bytes of the shard's live Raft log entries in the node log.", []string{"shard"}, nil)
	descTasks       = prometheus.NewDesc("taskstore_shard_tasks", "Tasks held by the shard's replica on this node.", []string{"shard"}, nil)
	descQueue       = prometheus.NewDesc("taskstore_queue_tasks", "Tasks per queue and state, on shards this node leads.", []string{"queue", "state"}, nil)
	descQueueAge    = prometheus.NewDesc("taskstore_queue_oldest_available_seconds", "Age of the oldest available task per queue, on shards this node leads; only for queues with their own series (not <group>/*).", []string{"queue"}, nil)
	descQueuePaused = prometheus.NewDesc("taskstore_queue_paused", "1 while the queue is paused (it hands out no claims; taskctl queue resume), on shards this node leads.", []string{"queue"}, nil)
	descGossip      = prometheus.NewDesc("taskstore_gossip_members", "Nodes gossip sees, by health.", []string{"health"}, nil)
	descDiverged    = prometheus.NewDesc("taskstore_shard_diverged", "1 while this node's replica of the shard is stopped because its state diverged from the majority's (rebuild it with taskctl shard rebuild), else 0.", []string{"shard"}, nil)
	descDisagree    = prometheus.NewDesc("taskstore_shard_replicas_disagree", "1 while the shard's voters' state checkpoints disagree with no majority for one digest, as this node sees them, else 0.", []string{"shard"}, nil)
	descHealthy     = prometheus.NewDesc("taskstore_shard_replicas_healthy", "On the shard's leader: voters of the shard on nodes gossip sees alive, the leader included. Below taskstore_shard_replicas_placed, the shard is under-replicated.", []string{"shard"}, nil)
	descPlaced      = prometheus.NewDesc("taskstore_shard_replicas_placed", "On the shard's leader: replicas the cluster map places for the shard.", []string{"shard"}, nil)
	descShardSlots  = prometheus.NewDesc("taskstore_shard_slots", "On the shard's leader: hash slots the routing table gives the shard.", []string{"shard"}, nil)
	descSlotMoves   = prometheus.NewDesc("taskstore_slot_moves", "On the meta leader: slot moves under way, by phase (copying: the slot's writers wait; flipped; aborting).", []string{"phase"}, nil)
	descMemUsed     = prometheus.NewDesc("taskstore_shard_memory_used_bytes", "What the shard's tasks take on this replica by the memory budget's count (their ids, keys, values and errors plus a fixed overhead per task); the same on every replica.", []string{"shard"}, nil)
	descMemBudget   = prometheus.NewDesc("taskstore_shard_memory_budget_bytes", "The shard's share of this node's --memory-limit for its tasks in memory (half the limit, split between the replicas the node hosts), stamped into every write this node proposes as leader: past it, inserts are refused with RESOURCE_EXHAUSTED. Absent on disk or without a limit.", []string{"shard"}, nil)
	descMemLimit    = prometheus.NewDesc("taskstore_memory_limit_bytes", "The memory this node may use (--memory-limit: by default the container's or cgroup's limit, else a share of the machine's memory); 0: no limit.", nil, nil)
	descVoteAnswers = prometheus.NewDesc("taskstore_raft_vote_answers_after_loss_total", "Only for a replica that started after its raft.db lost its term and vote (or was damaged): the vote requests it answered since, by answer: granted, refused (by raft), held (a vote or pre-vote request refused while it was held: it had not caught up, or nothing proves its term; taskctl status shows role held). group is meta or the shard's id.", []string{"group", "answer"}, nil)
	shardDescList   = []*prometheus.Desc{descVoteAnswers, descMemUsed, descMemBudget, descMemLimit, descShardSlots, descSlotMoves, descHealthy, descPlaced, descLeader, descTerm, descCommit, descApplied, descLogBytes, descTasks, descQueue, descQueueAge, descQueuePaused, descGossip, descDiverged, descDisagree}
)

// healthyVoters counts the voters of s's Raft configuration whose node
// gossip sees alive; this node counts as alive.
func (c *shardCollector) healthyVoters(s *Shard, members map[string]gossipMember) int {
	f := s.g.raft.GetConfiguration()
	if f.Error() != nil {
		return 0
	}
	n := 0
	for _, srv := range f.Configuration().Servers {
		if srv.Suffrage != raft.Voter {
			continue
		}
		if id := string(srv.ID); id == c.n.cfg.ID || members[id].Health == HealthAlive {
			n++
		}
	}
	return n
}

// shardCollector reads per-shard state when Prometheus scrapes.
type shardCollector struct{ n *Node }

func (c *shardCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range shardDescList {
		ch <- d
	}
}

func (c *shardCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	type queueAgg struct {
		available, claimed, delayed uint64
		oldest                      int64
		paused                      bool
		folded                      bool // "<group>/*": no age
	}
	queues := map[string]*queueAgg{}
	// One look under the lock: a shard is either local or diverged, and a
	// series collected twice fails the scrape.
	c.n.mu.RLock()
	for id := range c.n.diverged {
		gauge(descDiverged, 1, shardLabel(id))
	}
	disagree := map[uint32]bool{}
	for id := range c.n.disagree {
		disagree[id] = true
	}
	local := make([]*Shard, 0, len(c.n.shards))
	for _, s := range c.n.shards {
		local = append(local, s)
	}
	c.n.mu.RUnlock()
	cm := c.n.meta.Map()
	members := c.n.gossip.snapshot()
	gauge(descMemLimit, float64(max(c.n.cfg.MemoryLimit, 0)))
	budget := c.n.memory.shardBytes()
	votes := func(h *voteHold, group string) {
		if h == nil {
			return
		}
		granted, refused, held := h.VoteAnswers()
		ch <- prometheus.MustNewConstMetric(descVoteAnswers, prometheus.CounterValue, float64(granted), group, "granted")
		ch <- prometheus.MustNewConstMetric(descVoteAnswers, prometheus.CounterValue, float64(refused), group, "refused")
		ch <- prometheus.MustNewConstMetric(descVoteAnswers, prometheus.CounterValue, float64(held), group, "held")
	}
	if c.n.metaGroup != nil {
		votes(c.n.metaGroup.hold, "meta")
	}
	for _, s := range local {
		label := shardLabel(s.id)
		votes(s.g.hold, label)
		gauge(descDiverged, 0, label)
		v := 0.0
		if disagree[s.id] {
			v = 1
		}
		gauge(descDisagree, v, label)
		stats := s.g.raft.Stats()
		num := func(k string) float64 { v, _ := strconv.ParseUint(stats[k], 10, 64); return float64(v) }
		leader := 0.0
		if s.IsLeader() {
			leader = 1
		}
		gauge(descLeader, leader, label)
		gauge(descTerm, num("term"), label)
		gauge(descCommit, num("commit_index"), label)
		gauge(descApplied, num("applied_index"), label)
		gauge(descTasks, float64(s.machine.TaskCount()), label)
		gauge(descMemUsed, float64(s.machine.MemoryUse(TaskOverheadBytes)), label)
		if budget > 0 {
			gauge(descMemBudget, float64(budget), label)
		}
		if g, ok := s.g.logs.(interface{ Bytes() int64 }); ok {
			gauge(descLogBytes, float64(g.Bytes()), label)
		}
		if leader == 0 {
			continue
		}
		if sh := control.FindShard(cm, s.id); sh != nil {
			slots := 0
			for _, id := range cm.Slots {
				if id == s.id {
					slots++
				}
			}
			gauge(descShardSlots, float64(slots), label)
			gauge(descPlaced, float64(len(sh.Replicas)), label)
			gauge(descHealthy, float64(c.healthyVoters(s, members)), label)
		}
		// A queue gets its own series while there is room; the oldest
		// available task (a read of the state per queue, where the counts
		// are in memory) is looked up for those only, so a scrape costs
		// MaxQueueSeries reads however many queues there are. A "<group>/*"
		// series sums counts and reports no age.
		own := func(name string) bool {
			if _, ok := queues[name]; ok || len(queues) < MaxQueueSeries {
				if !ok {
					queues[name] = &queueAgg{}
				}
				return true
			}
			return false
		}
		s.machine.QueueCounts(own, func(q fsm.QueueStats) {
			name := q.Name
			if !own(name) { // a queue with settings and no tasks is not asked about its oldest
				name = fsm.GroupOf(q.Name) + "/*"
			}
			a := queues[name]
			if a == nil {
				a = &queueAgg{folded: true}
				queues[name] = a
			}
			a.paused = a.paused || q.Paused
			a.available += q.Available
			a.claimed += q.Claimed
			a.delayed += q.Delayed
			if q.OldestAvailableAt != 0 && (a.oldest == 0 || q.OldestAvailableAt < a.oldest) {
				a.oldest = q.OldestAvailableAt
			}
		})
	}
	now := c.n.cfg.Clock().UnixNano()
	for name, a := range queues {
		gauge(descQueue, float64(a.available), name, "available")
		gauge(descQueue, float64(a.claimed), name, "claimed")
		gauge(descQueue, float64(a.delayed), name, "delayed")
		if !a.folded {
			age := 0.0
			if a.oldest != 0 {
				age = max(time.Duration(now-a.oldest).Seconds(), 0)
			}
			gauge(descQueueAge, age, name)
		}
		paused := 0.0
		if a.paused {
			paused = 1
		}
		gauge(descQueuePaused, paused, name)
	}
	if c.n.metaLead.ready.Load() {
		phases := map[string]float64{"copying": 0, "flipped": 0, "aborting": 0}
		for _, mv := range cm.Moves {
			phases[MovePhaseName(mv.Phase)]++
		}
		for p, v := range phases {
			gauge(descSlotMoves, v, p)
		}
	}
	health := map[string]float64{}
	for _, m := range c.n.gossip.snapshot() {
		health[m.Health]++
	}
	for h, v := range health {
		gauge(descGossip, v, h)
	}
}

// timedFSM wraps a shard's machine to time snapshot writes; it keeps the
// batching interface so raft still hands over batches.
type timedFSM struct {
	*fsm.Machine
	observe func(time.Duration)
}

var _ raft.BatchingFSM = timedFSM{}

func (f timedFSM) Snapshot() (raft.FSMSnapshot, error) {
	s, err := f.Machine.Snapshot()
	if err != nil {
		return nil, err
	}
	return timedSnapshot{FSMSnapshot: s, observe: f.observe}, nil
}

type timedSnapshot struct {
	raft.FSMSnapshot
	observe func(time.Duration)
}

func (s timedSnapshot) Persist(sink raft.SnapshotSink) error {
	start := time.Now()
	err := s.FSMSnapshot.Persist(sink)
	if err == nil {
		s.observe(time.Since(start))
	}
	return err
}
