// Package fsmpb is the log and snapshot format of a shard's state machine,
// generated from fsm.proto (`go generate` or `make proto`).
package fsmpb

//go:generate make -C ../.. proto-fsm
