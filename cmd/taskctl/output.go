package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/internal/bytesize"
)

// valueWidth is how many characters of a value a table shows.
const valueWidth = 40

// errWidth bounds the ERR column of task tables.
const errWidth = 30

// printJSON writes m as protobuf's canonical JSON, indented. protojson's own
// whitespace is deliberately unstable, so it is normalized here.
func printJSON(w io.Writer, m proto.Message) error {
	raw, err := protojson.Marshal(m)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return err
	}
	buf.WriteByte('\n')
	_, err = w.Write(buf.Bytes())
	return err
}

// printJSONValue writes v (not a protobuf message) as indented JSON.
func printJSONValue(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// table writes aligned columns.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	if len(header) > 0 {
		t.row(header...)
	}
	return t
}

func (t *table) row(cells ...string) { fmt.Fprintln(t.tw, strings.Join(cells, "\t")) }

func (t *table) flush() error { return t.tw.Flush() }

// formatValue renders a task value for a table: text when it is valid UTF-8
// (escaped, so a value never breaks the layout), else its size and leading
// bytes in hex; cut to width characters when width > 0.
func formatValue(v []byte, width int) string {
	if len(v) == 0 {
		return "-"
	}
	var s string
	if utf8.Valid(v) {
		q := strconv.Quote(string(v))
		s = q[1 : len(q)-1]
	} else {
		n := min(len(v), 16)
		s = fmt.Sprintf("<%d bytes> %x", len(v), v[:n])
		if n < len(v) {
			s += "…"
		}
	}
	if width > 0 && utf8.RuneCountInString(s) > width {
		s = string([]rune(s)[:width-1]) + "…"
	}
	return s
}

func formatTime(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().UTC().Format(time.RFC3339)
}

func formatDuration(d *durationpb.Duration) string {
	if d == nil {
		return "-"
	}
	return d.AsDuration().Round(time.Millisecond).String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func joinUint(ids []uint32) string {
	if len(ids) == 0 {
		return "-"
	}
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = strconv.FormatUint(uint64(id), 10)
	}
	return strings.Join(parts, ",")
}

func u64(v uint64) string { return strconv.FormatUint(v, 10) }

// printTasks writes tasks as a table, one row each; a HEADERS column when
// any task has headers.
func printTasks(w io.Writer, tasks []*taskstorepb.Task) error {
	cols := []string{"ID", "VERSION", "QUEUE", "AT", "CLAIMANT", "PRIORITY", "CLAIMS", "ATTEMPT", "KEY", "ERR", "VALUE"}
	withHeaders := slices.ContainsFunc(tasks, func(t *taskstorepb.Task) bool { return len(t.Headers) > 0 })
	if withHeaders {
		cols = slices.Insert(cols, len(cols)-1, "HEADERS")
	}
	t := newTable(w, cols...)
	for _, task := range tasks {
		row := []string{task.Id, u64(task.Version), task.Queue, formatTime(task.At), orDash(task.Claimant),
			strconv.Itoa(int(task.Priority)), u64(uint64(task.Claims)), u64(uint64(task.Attempt)), orDash(task.Key),
			formatValue([]byte(task.Err), errWidth), formatValue(task.Value, valueWidth)}
		if withHeaders {
			row = slices.Insert(row, len(row)-1, formatValue([]byte(formatHeaders(task.Headers)), valueWidth))
		}
		t.row(row...)
	}
	return t.flush()
}

// formatHeaders writes headers as KEY=VALUE pairs in key order, "-" for none.
func formatHeaders(h map[string]string) string {
	if len(h) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(h))
	for _, k := range slices.Sorted(maps.Keys(h)) {
		parts = append(parts, k+"="+h[k])
	}
	return strings.Join(parts, ",")
}

// printTask writes every field of one task, the value in full.
func printTask(w io.Writer, task *taskstorepb.Task) error {
	t := newTable(w)
	t.row("id:", task.Id)
	t.row("version:", u64(task.Version))
	t.row("queue:", task.Queue)
	t.row("at:", formatTime(task.At))
	t.row("claimant:", orDash(task.Claimant))
	t.row("priority:", strconv.Itoa(int(task.Priority)))
	t.row("key:", orDash(task.Key))
	t.row("created:", formatTime(task.Created))
	t.row("modified:", formatTime(task.Modified))
	t.row("claims:", u64(uint64(task.Claims)))
	t.row("attempt:", u64(uint64(task.Attempt)))
	t.row("err:", orDash(task.Err))
	if len(task.Headers) > 0 {
		t.row("headers:", formatHeaders(task.Headers))
	}
	t.row("value:", formatValue(task.Value, 0))
	return t.flush()
}

func printQueues(w io.Writer, queues []*taskstorepb.QueueStats) error {
	t := newTable(w, "QUEUE", "SHARD", "TOTAL", "AVAILABLE", "CLAIMED", "DELAYED", "OLDEST AVAILABLE", "PAUSED", "LIMIT", "POLICY")
	for _, q := range queues {
		t.row(q.Name, u64(uint64(q.Shard)), u64(q.Total), u64(q.Available), u64(q.Claimed), u64(q.Delayed), formatDuration(q.OldestAvailableAge),
			pausedWord(q.Paused), limitWord(q.MaxClaimed), policyColumn(q.Policy))
	}
	return t.flush()
}

func printNodes(w io.Writer, nodes []*taskstorepb.NodeStatus) error {
	t := newTable(w, "ID", "ADDRESS", "STATE", "HEALTH", "DISK FREE", "SHARDS", "LEADS")
	for _, n := range nodes {
		disk := "-" // the node did not answer
		if n.DiskMeasured || n.DiskFreeBytes > 0 {
			disk = bytesize.Format(n.DiskFreeBytes) // 0 B: a full disk
		}
		if n.DiskLow {
			// The node refuses to lead until space is freed.
			disk += " LOW"
		}
		t.row(n.Id, orDash(n.Address), orDash(n.State), orDash(n.Health), disk, joinUint(n.Shards), joinUint(n.Leads))
	}
	return t.flush()
}

// shardState is "ok", or what is wrong with the shard: no leader, replicas
// stopped because their state diverged, and replicas that found the
// voters disagreeing with no majority.
func shardState(s *taskstorepb.ShardStatus) string {
	var diverged, damaged, disagree []string
	for _, r := range s.ReplicaStatus {
		switch {
		case r.GetDivergence().GetDamaged() != "":
			// Stopped (diverged role) or following without a vote (held).
			damaged = append(damaged, r.Node)
		case r.Role == "diverged":
			diverged = append(diverged, r.Node)
		}
		if r.Disagreement != "" {
			disagree = append(disagree, r.Node)
		}
	}
	var out []string
	if s.Leader == "" {
		// Nothing it holds can be written or read consistently until one
		// is elected (or a node that just restarted has not heard of it).
		out = append(out, "NO-LEADER")
	}
	if len(diverged) > 0 {
		out = append(out, "DIVERGED:"+strings.Join(diverged, ","))
	}
	if len(damaged) > 0 {
		out = append(out, "DAMAGED:"+strings.Join(damaged, ","))
	}
	if len(disagree) > 0 {
		out = append(out, "REPLICAS-DISAGREE(seen by "+strings.Join(disagree, ",")+")")
	}
	if s.Retiring {
		out = append(out, "RETIRING")
	}
	if healthy, placed := taskstorepb.HealthyReplicas(s); healthy < placed {
		out = append(out, fmt.Sprintf("UNDER-REPLICATED(%d/%d)", healthy, placed))
	}
	if len(out) == 0 {
		return "ok"
	}
	return strings.Join(out, " ")
}

// replicaList is a shard's replicas, the preferred leader marked with "*".
func replicaList(s *taskstorepb.ShardStatus) string {
	out := make([]string, len(s.Replicas))
	for i, r := range s.Replicas {
		out[i] = r
		if r == s.PreferredLeader {
			out[i] += "*"
		}
	}
	return strings.Join(out, ",")
}

// printShards writes one row per shard: the leader's commit and applied
// index, the largest lag of any replica, and the largest Raft log any
// replica retains.
func printShards(w io.Writer, shards []*taskstorepb.ShardStatus) error {
	t := newTable(w, "SHARD", "LEADER", "TERM", "REPLICAS", "SLOTS", "TASKS", "MEMORY", "COMMIT", "APPLIED", "LAG", "LOG", "STATE")
	for _, s := range shards {
		if s == nil {
			continue
		}
		id := u64(uint64(s.Id))
		if s.Id == 0 {
			id = "meta"
		}
		commit, applied, lag, logBytes, memory := "-", "-", "-", "-", "-"
		var maxLag, maxLog uint64
		for _, r := range s.ReplicaStatus {
			if r.Node == s.Leader || r.Role == "leader" {
				commit, applied = u64(r.CommitIndex), u64(r.AppliedIndex)
				if s.Id != 0 {
					memory = memoryFill(r.MemoryUsed, r.MemoryBudget)
				}
			}
			maxLag = max(maxLag, r.Lag)
			maxLog = max(maxLog, r.LogBytes)
		}
		if maxLog > 0 {
			logBytes = bytesize.Format(maxLog)
		}
		if len(s.ReplicaStatus) > 0 {
			lag = u64(maxLag)
		}
		slots, tasks := "-", "-"
		if s.Id != 0 {
			slots = u64(uint64(s.Slots))
			if s.Tasks > 0 || len(s.ReplicaStatus) > 0 {
				tasks = u64(s.Tasks)
			}
		}
		t.row(id, orDash(s.Leader), u64(s.Term), orDash(replicaList(s)), slots, tasks, memory, commit, applied, lag, logBytes, shardState(s))
	}
	return t.flush()
}

// memoryFill prints what a shard's tasks take in memory against the
// budget its leader stamps, and how full it is ("40.0MiB/53.3MiB 75%"):
// inserts are refused at 100%. "-": no budget (on disk, or no limit).
func memoryFill(used, budget uint64) string {
	if budget == 0 {
		return "-"
	}
	return fmt.Sprintf("%s/%s %d%%", bytesize.Format(used), bytesize.Format(budget), used*100/budget)
}
