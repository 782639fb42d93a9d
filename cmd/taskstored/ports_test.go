package main

import (
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
)

// TestCheckPortsNamesTheTakenPortAndItsOwner holds one TCP port and one
// UDP port in this process: checkPorts names each, with its owner's pid
// on Linux, and passes once they are free.
func TestCheckPortsNamesTheTakenPortAndItsOwner(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	taken := l.Addr().String()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	free.Close()
	err = checkPorts([]port{{addr: freeAddr, what: "free"}, {addr: taken, what: "n2 gRPC and Raft"}})
	if err == nil || !strings.Contains(err.Error(), taken+" (n2 gRPC and Raft) is in use") {
		t.Fatalf("checkPorts = %v, want it to name %s", err, taken)
	}
	if _, statErr := os.Stat("/proc/net/tcp"); statErr == nil && !strings.Contains(err.Error(), fmt.Sprintf("by pid %d ", os.Getpid())) {
		t.Errorf("checkPorts = %v, want it to name this process (pid %d)", err, os.Getpid())
	}
	l.Close()

	pc := listenUDPFreeForTCP(t)
	udpAddr := pc.LocalAddr().String()
	if err := checkPorts([]port{{addr: udpAddr, what: "n1 gossip", udp: true}}); err == nil || !strings.Contains(err.Error(), udpAddr+" (n1 gossip) is in use") {
		t.Fatalf("checkPorts with the UDP port taken = %v", err)
	}
	pc.Close()
	if err := checkPorts([]port{{addr: taken, what: "n2"}, {addr: udpAddr, what: "n1 gossip", udp: true}}); err != nil {
		t.Fatalf("checkPorts after release: %v", err)
	}
}

// listenUDPFreeForTCP holds a UDP port whose number no TCP socket holds:
// checkPorts checks a gossip port as both, and an ephemeral UDP port's
// number may be in use as another connection's TCP port on the machine
// (the test failed so once).
func listenUDPFreeForTCP(t *testing.T) net.PacketConn {
	t.Helper()
	for range 100 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			l.Close()
			return pc
		}
		pc.Close()
	}
	t.Fatal("no UDP port whose number is free for TCP too in 100 tries")
	return nil
}
