// Package gcpercent sets the garbage collector's growth target of the
// servers (taskstored, taskproxy) when the operator did not: Go's default,
// a collection each time the heap doubles, spends a large share of a
// server's CPU on collections when its live heap is small (a node with its
// state on disk, a proxy, any node before its backlog grows), and a node's
// collections lengthen the requests they overlap. A node's memory limit
// stays the bound: the collector's soft limit (GOMEMLIMIT, or what
// taskstored derives from --memory-limit) makes it collect sooner as the
// heap nears it, whatever the growth target.
package gcpercent
