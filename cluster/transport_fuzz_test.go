package cluster

import (
	"bytes"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// FuzzRaftStream sends arbitrary bytes on the shared port: a Raft header
// (magic, group id) or not, then anything, into a real NetworkTransport of
// group 1 whose consumer refuses every RPC. Nothing may panic the node, and
// a proper connection of group 1 still gets through afterwards.
func FuzzRaftStream(f *testing.F) {
	hdr := func(group uint32) []byte {
		b := []byte(raftMagic)
		return binary.BigEndian.AppendUint32(b, group)
	}
	f.Add(append(hdr(1), 0, 0x80))                           // AppendEntries, empty map
	f.Add(append(hdr(1), 1, 0xdf, 0xff, 0xff, 0xff, 0xff))   // RequestVote, a map claiming 4G entries
	f.Add(append(hdr(1), 2, 0xc6, 0x7f, 0xff, 0xff, 0xff))   // InstallSnapshot, a 2 GiB bin
	f.Add(append(hdr(7), 0))                                 // a group not hosted
	f.Add([]byte("TSRAFT1"))                                 // a cut magic
	f.Add(append(hdr(1), bytes.Repeat([]byte{0xff}, 64)...)) // garbage after the header

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	m := NewMux(l, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, nil)
	go m.Serve()
	f.Cleanup(m.Close)
	go func() { // what is not Raft goes to gRPC: close it at once
		for {
			c, err := m.GRPCListener().Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	sl, err := m.StreamLayer(1)
	if err != nil {
		f.Fatal(err)
	}
	trans := raft.NewNetworkTransport(sl, 1, time.Second, io.Discard)
	f.Cleanup(func() { trans.Close() })
	go func() {
		for rpc := range trans.Consumer() {
			rpc.Respond(nil, raft.ErrNotLeader)
		}
	}()
	addr := raft.ServerAddress(l.Addr().String())

	f.Fuzz(func(t *testing.T, data []byte) {
		conn, err := net.Dial("tcp", string(addr))
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(50 * time.Millisecond))
		conn.Write(data)
		io.Copy(io.Discard, conn) // until the node closes it or the deadline
		conn.Close()
		// The group still answers a well-formed request.
		var resp raft.RequestVoteResponse
		err = trans.RequestVote("x", addr, &raft.RequestVoteRequest{RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax}, Term: 1}, &resp)
		if err == nil || err.Error() != raft.ErrNotLeader.Error() {
			t.Fatalf("a proper RequestVote after %x: %v, want the consumer's refusal", data, err)
		}
	})
}
