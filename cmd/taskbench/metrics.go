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
	var total logCounters
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
		for shard, v := range m.commit {
			commit[shard] = max(commit[shard], v)
		}
	}
	for _, v := range commit {
		total.commitIndex += v
	}
	return total, nil
}

type nodeCounters struct {
	applies float64
	commit  map[string]float64
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

// parseMetrics reads the two series we need from the Prometheus text format.
func parseMetrics(r io.Reader) (nodeCounters, error) {
	out := nodeCounters{commit: map[string]float64{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		var isApply bool
		switch {
		case strings.HasPrefix(line, "taskstore_shard_apply_seconds_count{"):
			isApply = true
		case strings.HasPrefix(line, "taskstore_shard_commit_index{"):
		default:
			continue
		}
		shard := labelValue(line, "shard")
		if shard == "" || shard == "0" {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(strings.TrimSpace(line[i+1:]), 64)
		if i < 0 || err != nil {
			continue
		}
		if isApply {
			out.applies += v
		} else {
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
