package cluster

import (
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// TestMuxRoutesRaftByGroupAndRestToGRPC checks that one listener carries
// Raft connections of several groups and other traffic side by side.
func TestMuxRoutesRaftByGroupAndRestToGRPC(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := NewMux(l, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, nil)
	go m.Serve()
	defer m.Close()

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
