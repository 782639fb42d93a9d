// Package metapb is the meta group's log format and state, the cluster map,
// generated from meta.proto (`go generate` or `make proto`).
package metapb

//go:generate make -C ../.. proto-meta
