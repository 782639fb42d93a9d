// Package peerpb is the internal node-to-node service, Peer, generated from
// peer.proto (`go generate` or `make proto`). Only nodes call it; it is not
// part of the public API.
package peerpb

//go:generate make -C ../.. proto-peer
