package cluster

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestPipelineSendDoesNotParkForEver reproduces the state hashicorp/raft's
// replication leaves a pipeline in when pipelineDecode has returned
// (pipeline.go): nobody reads the pipeline's responses. Over real TCP
// transports, the follower answers every AppendEntries; the decoder takes
// the first response and parks handing it over, and the next send parks
// in the hand-off. Raft's own pipeline would hold it for ever; ours closes
// the pipeline after the stall and the send returns an error.
func TestPipelineSendDoesNotParkForEver(t *testing.T) {
	follower, err := raft.NewTCPTransport("127.0.0.1:0", nil, 3, 10*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer follower.Close()
	go func() {
		for rpc := range follower.Consumer() {
			rpc.Respond(&raft.AppendEntriesResponse{Term: 1, Success: true}, nil)
		}
	}()
	leader, err := raft.NewTCPTransport("127.0.0.1:0", nil, 3, 10*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer leader.Close()
	trans := serialTransport{NetworkTransport: leader, stall: 300 * time.Millisecond}
	p, err := trans.AppendEntriesPipeline("f", follower.LocalAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	// Nobody reads p.Consumer(), as after pipelineDecode returned.
	sent := make(chan error, 1)
	go func() {
		for i := range 4 {
			req := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax}, Term: 1, PrevLogEntry: uint64(i)}
			if _, err := p.AppendEntries(req, new(raft.AppendEntriesResponse)); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	select {
	case err := <-sent:
		if err == nil {
			t.Fatal("four sends with nobody reading the responses all succeeded: the hand-off was not what this test assumes")
		}
		if !errors.Is(err, raft.ErrPipelineShutdown) {
			t.Logf("the parked send ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a pipelined send is still parked after 10 s: the pipeline was not closed")
	}
}
