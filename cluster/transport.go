package cluster

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"github.com/soheilhy/cmux"

	"github.com/e1158ecb/taskstore/auth"
)

// raftMagic opens every Raft connection so that it can share the node's gRPC
// port: the mux sends connections that start with it to the Raft groups and
// everything else (HTTP/2) to the gRPC server. A 4-byte big-endian group id
// follows the magic.
const raftMagic = "TSRAFT1\n"

// Dialer opens node-to-node connections. Tests replace it to inject faults.
type Dialer func(ctx context.Context, address string) (net.Conn, error)

// Mux splits one listener into the gRPC listener and a stream layer per Raft
// group. It is safe for concurrent use.
type Mux struct {
	root net.Listener
	// peerTLS, when set, secures Raft connections: dialled ones present
	// this node's certificate and verify the peer's; accepted ones must
	// present a node certificate from the cluster CA.
	peerTLS *tls.Config
	tls     bool
	cm      cmux.CMux
	grpcL   net.Listener
	raftL   net.Listener
	dial    Dialer
	log     *slog.Logger

	mu     sync.Mutex // guards groups and closed
	groups map[uint32]*streamLayer
	closed bool
}

// NewMux wraps l. Serve must be called to start accepting. With serverTLS,
// every connection is TLS, terminated below the mux, so Raft and gRPC share
// the port and the handshake; peerTLS then secures the Raft connections this
// node dials (see auth.TLSFiles.PeerConfig).
func NewMux(l net.Listener, dial Dialer, log *slog.Logger, serverTLS, peerTLS *tls.Config) *Mux {
	if dial == nil {
		var d net.Dialer
		dial = func(ctx context.Context, address string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", address)
		}
	}
	m := &Mux{root: l, dial: dial, log: log, groups: make(map[uint32]*streamLayer), peerTLS: peerTLS}
	if serverTLS != nil {
		l = tls.NewListener(l, serverTLS)
		m.tls = true
	}
	m.cm = cmux.New(l)
	m.cm.SetReadTimeout(10 * time.Second)
	m.raftL = m.cm.Match(matchRaft)
	m.grpcL = m.cm.Match(cmux.Any())
	return m
}

// GRPCListener is the listener to hand to grpc.Server.Serve.
func (m *Mux) GRPCListener() net.Listener { return m.grpcL }

// Addr is the shared listen address.
func (m *Mux) Addr() net.Addr { return m.root.Addr() }

// Serve accepts connections until Close.
func (m *Mux) Serve() {
	go m.acceptRaft()
	if err := m.cm.Serve(); err != nil && !m.isClosed() && !errors.Is(err, net.ErrClosed) {
		m.log.Warn("listener stopped", "err", err)
	}
}

func (m *Mux) isClosed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closed
}

// Close stops the listener and every group's stream layer.
func (m *Mux) Close() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	m.mu.Unlock()
	m.cm.Close()
	m.root.Close()
}

func (m *Mux) acceptRaft() {
	for {
		conn, err := m.raftL.Accept()
		if err != nil {
			return
		}
		go m.route(conn)
	}
}

// route reads a Raft connection's header and hands it to its group.
func (m *Mux) route(conn net.Conn) {
	var hdr [len(raftMagic) + 4]byte
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(conn, hdr[:]); err != nil || string(hdr[:len(raftMagic)]) != raftMagic {
		conn.Close()
		return
	}
	conn.SetReadDeadline(time.Time{})
	group := binary.BigEndian.Uint32(hdr[len(raftMagic):])
	if m.tls {
		if err := verifyRaftPeer(conn); err != nil {
			m.log.Warn("refused a Raft connection", "remote", conn.RemoteAddr().String(), "group", group, "err", err)
			conn.Close()
			return
		}
	}
	m.mu.Lock()
	sl := m.groups[group]
	m.mu.Unlock()
	if sl == nil {
		// Not hosted here (yet): the sender's transport retries.
		conn.Close()
		return
	}
	select {
	case sl.conns <- conn:
	case <-sl.done:
		conn.Close()
	}
}

// matchRaft reads exactly the magic's length: cmux.PrefixMatcher may read
// further and stall a client that has sent only a few bytes.
func matchRaft(r io.Reader) bool {
	var buf [len(raftMagic)]byte
	_, err := io.ReadFull(r, buf[:])
	return err == nil && string(buf[:]) == raftMagic
}

// verifyRaftPeer admits only nodes of this cluster to Raft: the listener
// verified any certificate offered against the CA; it must also be a node's.
func verifyRaftPeer(conn net.Conn) error {
	cs := auth.ConnState(conn)
	if cs == nil {
		return errors.New("not a TLS connection")
	}
	if len(cs.VerifiedChains) == 0 {
		return errors.New("no client certificate from this cluster's CA")
	}
	if role := auth.RoleOf(cs.VerifiedChains[0][0]); role != auth.RoleNode {
		return fmt.Errorf("certificate %q has role %q, not node", cs.VerifiedChains[0][0].Subject.CommonName, role)
	}
	return nil
}

// StreamLayer returns the raft.StreamLayer of one group. Closing it
// unregisters the group.
func (m *Mux) StreamLayer(group uint32) (raft.StreamLayer, error) {
	return m.streamLayer(group)
}

func (m *Mux) streamLayer(group uint32) (*streamLayer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, net.ErrClosed
	}
	if m.groups[group] != nil {
		return nil, fmt.Errorf("raft group %d already has a stream layer", group)
	}
	sl := &streamLayer{mux: m, group: group, conns: make(chan net.Conn), done: make(chan struct{}),
		served: make(map[*servedConn]struct{})}
	m.groups[group] = sl
	return sl, nil
}

type streamLayer struct {
	mux   *Mux
	group uint32
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once

	servedMu sync.Mutex
	served   map[*servedConn]struct{} // accepted and not yet closed
	draining bool
	// peerClosed, when set, is called when an accepted connection ends
	// other than by drain (deadleader.go).
	peerClosed atomic.Pointer[func()]
}

var _ raft.StreamLayer = (*streamLayer)(nil)

// servedConn is an accepted connection. raft's NetworkTransport serves each
// in a goroutine of its own that closes the connection when it returns;
// done tells drain so.
type servedConn struct {
	net.Conn
	layer   *streamLayer
	once    sync.Once
	done    chan struct{}
	drained atomic.Bool
}

// Read reports a connection that drain closed as io.EOF, which raft's
// handler takes as a normal end instead of logging an error for each
// connection of each group on every shutdown.
func (c *servedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		if c.drained.Load() {
			err = io.EOF
		} else if f := c.layer.peerClosed.Load(); f != nil {
			(*f)()
		}
	}
	return n, err
}

func (c *servedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.layer.servedMu.Lock()
		delete(c.layer.served, c)
		c.layer.servedMu.Unlock()
		close(c.done)
	})
	return err
}

func (s *streamLayer) Accept() (net.Conn, error) {
	select {
	case c := <-s.conns:
		sc := &servedConn{Conn: c, layer: s, done: make(chan struct{})}
		s.servedMu.Lock()
		defer s.servedMu.Unlock()
		if s.draining {
			c.Close()
			return nil, net.ErrClosed
		}
		s.served[sc] = struct{}{}
		return sc, nil
	case <-s.done:
		return nil, net.ErrClosed
	}
}

// drain closes every accepted connection and waits, up to timeout, until
// the transport's handlers have returned from them; false if some have not.
// A group's log store must not close before. raft's heartbeat fast path
// used to save a new term on the transport's goroutine after raft.Shutdown
// and panic on the closed store (seen in CI: "failed to save current term:
// database not open"); serialTransport now declines that path, and drain
// stays so that no handler of a closed group can touch its store.
func (s *streamLayer) drain(timeout time.Duration) bool {
	s.servedMu.Lock()
	s.draining = true
	conns := make([]*servedConn, 0, len(s.served))
	for c := range s.served {
		conns = append(conns, c)
	}
	s.servedMu.Unlock()
	for _, c := range conns {
		c.drained.Store(true)
		c.Conn.Close() // unblocks the handler's read; it then calls c.Close
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for _, c := range conns {
		select {
		case <-c.done:
		case <-deadline.C:
			return false
		}
	}
	return true
}

func (s *streamLayer) Close() error {
	s.once.Do(func() {
		close(s.done)
		s.mux.mu.Lock()
		if s.mux.groups[s.group] == s {
			delete(s.mux.groups, s.group)
		}
		s.mux.mu.Unlock()
	})
	return nil
}

func (s *streamLayer) Addr() net.Addr { return s.mux.root.Addr() }

func (s *streamLayer) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := s.mux.dial(ctx, string(address))
	if err != nil {
		return nil, err
	}
	if s.mux.peerTLS != nil {
		tc := tls.Client(conn, s.mux.peerTLS)
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, fmt.Errorf("raft TLS handshake with %s: %w", address, err)
		}
		conn = tc
	}
	var hdr [len(raftMagic) + 4]byte
	copy(hdr[:], raftMagic)
	binary.BigEndian.PutUint32(hdr[len(raftMagic):], s.group)
	conn.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := conn.Write(hdr[:]); err != nil {
		conn.Close()
		return nil, err
	}
	conn.SetWriteDeadline(time.Time{})
	return conn, nil
}

// RaftPreamble is what a connection to one of a node's Raft groups opens
// with, for tools and tests that speak Raft to a node (harness.RequestVote).
func RaftPreamble(group uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte(raftMagic), group)
}
