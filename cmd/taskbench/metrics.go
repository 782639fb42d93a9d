package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/e1158ecb/taskstore/client"
)

// logCounters are cluster-wide totals read from the nodes' /metrics.
type logCounters struct {
	// applies is the sum over data shards (not the meta group, shard 0) and
	// nodes of taskstore_shard_apply_seconds_count. Only a shard's leader
	// observes it, once per raft.Apply, i.e. once per log entry, which the
	// leader fsyncs before it counts as committed. Summing over every node
	// keeps the total right across leader changes.
	applies float64
	// commitIndex is the sum over data shards of the highest
	// taskstore_shard_commit_index any node reports: the number of log
	// entries, including Raft's own (no-op on election, configuration).
	commitIndex float64
	// nodes is every scraped node's counters by node id, for the cost
	// accounting's per-node figures (cost.go).
	nodes map[string]nodeCounters
	// proxy is the local proxy's /metrics (its gRPC messages), when
	// taskbench started one and could read it.
	proxy *nodeCounters
}

// entries is the log entries the shard leaders proposed: the sum of
// taskstore_shard_proposed_entries_total when every node exports it (a
// leader may carry many writes in one entry), else the count of applies,
// which older builds observed once per entry.
func (l logCounters) entries() float64 {
	var sum float64
	for _, n := range l.nodes {
		if !n.hasProposed {
			return l.applies
		}
		sum += n.proposedEntries
	}
	return sum
}

// scrapeProxy adds the proxy's counters to l, if it can read them.
func (l *logCounters) scrapeProxy(ctx context.Context, httpAddr string) {
	if httpAddr == "" {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if m, err := scrapeNode(ctx, httpAddr); err == nil {
		l.proxy = &m
	}
}

// scrapeCluster reads the http addresses from Admin.Status and sums the
// counters of every node it can reach.
func scrapeCluster(ctx context.Context, c *client.Client) (logCounters, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := c.Status(ctx, nil)
	if err != nil {
		return logCounters{}, fmt.Errorf("status: %w", err)
	}
	total := logCounters{nodes: map[string]nodeCounters{}}
	commit := map[string]float64{}
	for _, n := range st.Nodes {
		if n.HttpAddress == "" {
			continue
		}
		m, err := scrapeNode(ctx, n.HttpAddress)
		if err != nil {
			return logCounters{}, fmt.Errorf("node %s: %w", n.Id, err)
		}
		total.applies += m.applies
		total.nodes[n.Id] = m
		for shard, v := range m.commit {
			commit[shard] = max(commit[shard], v)
		}
	}
	for _, v := range commit {
		total.commitIndex += v
	}
	return total, nil
}

// nodeCounters is what one node's /metrics says. A counter of the cost
// accounting is absent (has* false) on a node that does not export it, an
// older build: the report then prints "-" for it.
type nodeCounters struct {
	applies float64
	commit  map[string]float64

	// taskstore_log_syncs_total: fsync and fdatasync calls for the node's
	// Raft logs.
	syncs    float64
	hasSyncs bool
	// taskstore_log_append_entries histogram: entries written per log
	// append (one sync batch); _sum over _count is entries per sync.
	appendEntries, appendBatches float64
	hasAppend                    bool
	// taskstore_log_bytes_written_total.
	logBytes    float64
	hasLogBytes bool
	// process_cpu_seconds_total (Prometheus's process collector): the
	// node's CPU when taskbench does not know its pid.
	cpuSeconds float64
	hasCPU     bool
	// taskstore_shard_proposed_requests_total and _entries_total of the
	// data shards: commands proposed as leader, and the log entries that
	// carried them.
	proposedRequests, proposedEntries float64
	hasProposed                       bool
	// grpc_server_msg_received_total: gRPC messages the process received
	// (a unary call is one), from clients, the proxy and peers.
	grpcMsgs    float64
	hasGRPCMsgs bool
}

func scrapeNode(ctx context.Context, httpAddr string) (nodeCounters, error) {
	url := httpAddr
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return nodeCounters{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nodeCounters{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nodeCounters{}, fmt.Errorf("GET %s/metrics: %s", url, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads the series we need from the Prometheus text format.
// The per-node counters are summed over their label sets, if they have any.
func parseMetrics(r io.Reader) (nodeCounters, error) {
	out := nodeCounters{commit: map[string]float64{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, _, _ := strings.Cut(line, " ")
		name, _, _ = strings.Cut(name, "{")
		var node *float64
		var has *bool
		switch name {
		case "taskstore_shard_apply_seconds_count", "taskstore_shard_commit_index":
		case "taskstore_log_syncs_total":
			node, has = &out.syncs, &out.hasSyncs
		case "taskstore_log_append_entries_sum":
			node, has = &out.appendEntries, &out.hasAppend
		case "taskstore_log_append_entries_count":
			node, has = &out.appendBatches, &out.hasAppend
		case "taskstore_log_bytes_written_total":
			node, has = &out.logBytes, &out.hasLogBytes
		case "process_cpu_seconds_total":
			node, has = &out.cpuSeconds, &out.hasCPU
		case "grpc_server_msg_received_total":
			node, has = &out.grpcMsgs, &out.hasGRPCMsgs
		case "taskstore_shard_proposed_requests_total", "taskstore_shard_proposed_entries_total":
		default:
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(line[i+1:]), 64)
		if err != nil {
			continue
		}
		if node != nil {
			*node += v
			*has = true
			continue
		}
		shard := labelValue(line, "shard")
		if shard == "" || shard == "0" {
			continue
		}
		switch name {
		case "taskstore_shard_apply_seconds_count":
			out.applies += v
		case "taskstore_shard_proposed_requests_total":
			out.proposedRequests += v
			out.hasProposed = true
		case "taskstore_shard_proposed_entries_total":
			out.proposedEntries += v
			out.hasProposed = true
		default:
			out.commit[shard] = v
		}
	}
	return out, sc.Err()
}

func labelValue(line, name string) string {
	_, rest, ok := strings.Cut(line, name+`="`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}
