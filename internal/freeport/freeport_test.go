package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestAddrsAreDistinctBindableAndBelowTheEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	addrs, err := Addrs(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, addr := range addrs {
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if low > lowest && port >= low {
			t.Errorf("%s is in the ephemeral range (from %d): an outgoing connection could take it before the process binds it", addr, low)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("%s: not bindable: %v", addr, err)
		}
		l.Close()
	}
}
