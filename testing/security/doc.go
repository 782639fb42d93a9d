// Package security holds the tests of a secured cluster: TLS
// everywhere, certificate roles, bearer tokens, queue-prefix limits, Raft
// admitting only the cluster's nodes, and proxies speaking for their
// callers. The code under test is auth and its wiring in cluster, rpc
// and proxy; docs/security.md describes the model.
package security
