package cluster

import (
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// connPool keeps one client connection per peer address.
type connPool struct {
	opts  []grpc.DialOption
	mu    sync.Mutex // guards conns
	conns map[string]*grpc.ClientConn
}

func newConnPool(opts []grpc.DialOption) *connPool {
	// Accept any answer a node may send (taskstorepb.MaxResponseBytes), not
	// gRPC's default 4 MiB. Reconnect to a restarted peer within a second:
	// gRPC's default backoff grows to two minutes, and a peer that was down
	// for a while would stay missing from status and forwarding long after
	// it came back.
	opts = append([]grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(taskstorepb.MaxResponseBytes)),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 5 * time.Second,
		}),
	}, opts...)
	return &connPool{opts: opts, conns: make(map[string]*grpc.ClientConn)}
}

func (p *connPool) get(addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.conns[addr]; c != nil {
		return c, nil
	}
	c, err := grpc.NewClient(addr, p.opts...)
	if err != nil {
		return nil, err
	}
	p.conns[addr] = c
	return c, nil
}

func (p *connPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = map[string]*grpc.ClientConn{}
}
