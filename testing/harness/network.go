package harness

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/e1158ecb/taskstore/cluster"
)

// ErrPartitioned is what a dial across a cut link returns.
var ErrPartitioned = errors.New("harness: link cut")

// Network decides which node-to-node links work. Rules are one-way: Cut(a, b)
// stops a's connections to b (Raft and node-to-node gRPC that a opens).
// Connections already open across a link are closed when it is cut. It is
// safe for concurrent use.
type Network struct {
	mu    sync.Mutex // guards cut, delay and conns
	cut   map[[2]string]bool
	delay map[[2]string]time.Duration
	conns map[[2]string]map[net.Conn]struct{}
}

// NewNetwork returns a network with every link up.
func NewNetwork() *Network {
	return &Network{cut: map[[2]string]bool{}, delay: map[[2]string]time.Duration{}, conns: map[[2]string]map[net.Conn]struct{}{}}
}

// Cut stops traffic from a to b.
func (nw *Network) Cut(a, b string) {
	link := [2]string{a, b}
	nw.mu.Lock()
	nw.cut[link] = true
	var open []net.Conn
	for c := range nw.conns[link] {
		open = append(open, c)
	}
	nw.mu.Unlock()
	// Closed outside the lock: trackedConn.Close takes it.
	for _, c := range open {
		c.Close()
	}
}

// Partition cuts both directions between every node of side and every node
// not in it (of the given all).
func (nw *Network) Partition(side []string, all []string) {
	in := map[string]bool{}
	for _, s := range side {
		in[s] = true
	}
	for _, a := range all {
		for _, b := range all {
			if in[a] != in[b] {
				nw.Cut(a, b)
			}
		}
	}
}

// Delay adds latency to new connections from a to b.
func (nw *Network) Delay(a, b string, d time.Duration) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nw.delay[[2]string{a, b}] = d
}

// Heal restores every link.
func (nw *Network) Heal() {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nw.cut = map[[2]string]bool{}
	nw.delay = map[[2]string]time.Duration{}
}

// Dialer returns the dialer node from uses; idOf maps an address to a node id.
func (nw *Network) Dialer(from string, idOf func(string) string) cluster.Dialer {
	var d net.Dialer
	return func(ctx context.Context, addr string) (net.Conn, error) {
		link := [2]string{from, idOf(addr)}
		nw.mu.Lock()
		cut, delay := nw.cut[link], nw.delay[link]
		nw.mu.Unlock()
		if cut {
			return nil, ErrPartitioned
		}
		if delay > 0 {
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		tc := &trackedConn{Conn: conn, nw: nw, link: link}
		nw.mu.Lock()
		if nw.conns[link] == nil {
			nw.conns[link] = map[net.Conn]struct{}{}
		}
		nw.conns[link][tc] = struct{}{}
		nw.mu.Unlock()
		return tc, nil
	}
}

type trackedConn struct {
	net.Conn
	nw   *Network
	link [2]string
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.nw.mu.Lock()
		delete(c.nw.conns[c.link], c)
		c.nw.mu.Unlock()
	})
	return c.Conn.Close()
}
