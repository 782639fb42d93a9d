package cluster

import (
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// serveTestMux serves a Mux on a loopback port until the test ends.
func serveTestMux(t *testing.T) (*Mux, net.Listener) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := NewMux(l, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, nil)
	go m.Serve()
	t.Cleanup(func() { m.Close() })
	return m, l
}

// connectTo dials sl's group at addr and returns the accepted end; the
// dialled end closes when the test ends.
func connectTo(t *testing.T, sl raft.StreamLayer, addr raft.ServerAddress) net.Conn {
	t.Helper()
	dialed, err := sl.Dial(addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dialed.Close() })
	conn, err := sl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestMuxRoutesRaftByGroupAndRestToGRPC checks that one listener carries
// Raft connections of several groups and other traffic side by side.
func TestMuxRoutesRaftByGroupAndRestToGRPC(t *testing.T) {
	m, l := serveTestMux(t)

	g1, err := m.StreamLayer(1)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := m.StreamLayer(2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.StreamLayer(1); err == nil {
		t.Fatal("a second stream layer for group 1 was allowed")
	}

	echo := func(sl interface{ Accept() (net.Conn, error) }, reply string) {
		c, err := sl.Accept()
		if err != nil {
			return
		}
		buf := make([]byte, 8)
		io.ReadFull(c, buf)
		c.Write([]byte(reply + string(buf)))
		c.Close()
	}
	go echo(g1, "g1:")
	go echo(g2, "g2:")
	go echo(m.GRPCListener(), "rpc")

	for _, tc := range []struct {
		dial func() (net.Conn, error)
		want string
	}{
		{func() (net.Conn, error) { return g2.Dial(raft.ServerAddress(l.Addr().String()), time.Second) }, "g2:pingpong"},
		{func() (net.Conn, error) { return g1.Dial(raft.ServerAddress(l.Addr().String()), time.Second) }, "g1:pingpong"},
		{func() (net.Conn, error) { return net.Dial("tcp", l.Addr().String()) }, "rpcpingpong"},
	} {
		c, err := tc.dial()
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("pingpong"))
		got, _ := io.ReadAll(c)
		c.Close()
		if string(got) != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}

	// A closed group unregisters; its id can be registered again.
	g1.Close()
	if _, err := m.StreamLayer(1); err != nil {
		t.Fatalf("re-register group 1 after close: %v", err)
	}
}

// TestDrainWaitsForHandlers checks that a group's shutdown can wait for the
// transport's connection handlers: drain unblocks their reads, returns once
// each has closed its connection, and reports handlers that do not.
func TestDrainWaitsForHandlers(t *testing.T) {
	m, l := serveTestMux(t)
	sl, err := m.streamLayer(7)
	if err != nil {
		t.Fatal(err)
	}
	addr := raft.ServerAddress(l.Addr().String())

	// A handler like raft's: read until the connection fails, then do
	// some last work (a heartbeat saving a term) and close it.
	var lastWork atomic.Bool
	handled := make(chan struct{})
	conn := connectTo(t, sl, addr)
	var readErr error
	go func() {
		defer close(handled)
		_, readErr = conn.Read(make([]byte, 1))
		time.Sleep(50 * time.Millisecond)
		lastWork.Store(true)
		conn.Close()
	}()
	sl.Close()
	if !sl.drain(5 * time.Second) {
		t.Fatal("drain gave up on a handler that returns")
	}
	if !lastWork.Load() {
		t.Error("drain returned before the handler was done")
	}
	<-handled
	// raft's handler logs any read error but io.EOF.
	if readErr != io.EOF {
		t.Errorf("read on a drained connection: %v, want io.EOF (a quiet end)", readErr)
	}

	// A handler that never returns is reported, not waited for forever.
	sl2, err := m.streamLayer(8)
	if err != nil {
		t.Fatal(err)
	}
	stuck := connectTo(t, sl2, addr)
	defer stuck.Close()
	sl2.Close()
	if sl2.drain(100 * time.Millisecond) {
		t.Error("drain reported success while a handler still held its connection")
	}
	// After drain, nothing more is accepted.
	if _, err := sl2.Accept(); err == nil {
		t.Error("accepted a connection after drain")
	}
}
