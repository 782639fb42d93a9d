package cluster

import (
	"time"

	"github.com/hashicorp/raft"
)

// pipelineStall bounds how long one pipelined AppendEntries may wait to be
// handed to the pipeline's decoder. A healthy hand-off waits for at most
// one response, which NetworkTransport's read deadline bounds (Timeout,
// 10 s in newGroup); so three times that is never a healthy wait.
const pipelineStall = 30 * time.Second

// AppendEntriesPipeline is raft's pipeline with a watchdog on each send.
//
// hashicorp/raft (v1.7.3) can leave a follower's pipeline stuck for ever:
// when the follower answers Success=false or with a newer term,
// pipelineDecode returns and nobody reads the pipeline's responses any
// more; the send loop may still pick a trigger before it sees finishCh and
// send once more, which parks in netPipeline.AppendEntries (the hand-off
// channel is unbuffered at MaxRPCsInFlight 2) while the decoder parks
// handing over the previous response. pipelineReplicate never returns, so
// the follower gets heartbeats but no entries, and raft's Shutdown waits
// for it for ever. We saw the second half (a shard replica retired during
// the grow chaos scenario on a loaded machine never shut down; the same
// race is described in grafana/pyroscope#5518). Closing the pipeline ends
// the parked send with ErrPipelineShutdown; raft then stops pipelining to
// that follower and starts again, as after any pipeline error.
func (t serialTransport) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	p, err := t.NetworkTransport.AppendEntriesPipeline(id, target)
	if err != nil {
		return nil, err
	}
	stall := t.stall
	if stall == 0 {
		stall = pipelineStall
	}
	onStall := func() {
		if t.log != nil {
			t.log.Warn("closed a replication pipeline whose send waited too long; replication to the follower starts again (a hashicorp/raft race: cluster/DESIGN.md)",
				"peer", id, "waited", stall)
		}
	}
	w := &watchedPipeline{AppendPipeline: p, stall: stall}
	w.timer = time.AfterFunc(time.Hour, func() {
		onStall()
		p.Close()
	})
	w.timer.Stop()
	return w, nil
}

// watchedPipeline closes its pipeline when a send does not return within
// stall. Closing is always safe: raft treats it as any pipeline error. Raft
// sends on a pipeline from one goroutine, one send at a time, so one timer,
// armed while a send waits, watches them all.
type watchedPipeline struct {
	raft.AppendPipeline
	stall time.Duration
	timer *time.Timer
}

func (p *watchedPipeline) AppendEntries(args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) (raft.AppendFuture, error) {
	p.timer.Reset(p.stall)
	defer p.timer.Stop()
	return p.AppendPipeline.AppendEntries(args, resp)
}

func (p *watchedPipeline) Close() error {
	p.timer.Stop()
	return p.AppendPipeline.Close()
}
