package harness

import (
	"net"
	"strconv"
	"testing"
)

func TestFreeGossipAddrIsOutsideTheEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	seen := map[string]bool{}
	for range 20 {
		addr := freeGossipAddr(t)
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if low > 10100 && port >= low {
			t.Errorf("%s is in the ephemeral range (from %d): an outgoing connection could take it before the node binds it", addr, low)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("%s: not bindable: %v", addr, err)
		}
		l.Close()
	}
}
