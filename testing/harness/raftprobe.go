package harness

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/cluster"
)

// RequestVote asks the replica of a Raft group on the node at addr for its
// vote, as a candidate would: tests that play the candidate of an election
// (a node that must not vote, a vote it must not give twice).
func RequestVote(addr string, group uint32, req *raft.RequestVoteRequest) (*raft.RequestVoteResponse, error) {
	trans := raft.NewNetworkTransport(&probeStream{group: group, closed: make(chan struct{})}, 1, 5*time.Second, io.Discard)
	defer trans.Close()
	var resp raft.RequestVoteResponse
	if err := trans.RequestVote("", raft.ServerAddress(addr), req, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// probeStream dials a node's Raft port for one group; it accepts nothing.
type probeStream struct {
	group  uint32
	closed chan struct{}
	once   sync.Once
}

func (s *probeStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	conn, err := net.DialTimeout("tcp", string(address), timeout)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Write(cluster.RaftPreamble(s.group)); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

func (s *probeStream) Accept() (net.Conn, error) {
	<-s.closed
	return nil, errors.New("closed")
}

func (s *probeStream) Close() error {
	s.once.Do(func() { close(s.closed) })
	return nil
}

func (s *probeStream) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }
