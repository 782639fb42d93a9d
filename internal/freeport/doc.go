// Package freeport picks loopback addresses for processes that bind them
// later: the test harness's child nodes and taskbench --local's cluster.
//
// A port from 127.0.0.1:0 is itself ephemeral, and between the pick and the
// child's bind an outgoing connection of another node (a Raft dial, a
// gossip probe) may be given the same port; the child then fails with
// "address already in use" (seen in CI). So ports are picked below the
// kernel's ephemeral range, which is never used for outgoing connections,
// free for both TCP and UDP (gossip uses both), and never twice in one
// process.
package freeport
