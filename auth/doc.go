// Package auth secures Taskstore's network edges: TLS configuration from
// files, the roles carried by certificates, bearer tokens, and the policy
// that decides who may call what.
//
// Identities. A caller is a Principal with a role:
//
//   - node: a cluster member. Its certificate (organizational unit "node")
//     is the only one accepted on Raft connections, and it may call anything
//     (nodes forward admin calls to the meta leader).
//   - admin: operators. Everything a client may do, plus node add/remove,
//     shard transfer and queue purge.
//   - client: task operations (Modify, Claim, Tasks, Queues, Time) and the
//     read-only cluster calls clients need to route (Status, Routing). A
//     client may be limited to queue name prefixes.
//   - proxy: a stateless proxy. It authenticates its own callers with the
//     same policy and forwards their principal in the x-taskstore-principal
//     header, which a node believes only from a node or proxy certificate.
//
// A principal comes from a bearer token (metadata "authorization: Bearer T",
// tokens listed in a file) or else from the verified client certificate
// (role = the certificate's organizational unit). See docs/security.md.
//
// The package imports only the API types (api/taskstorepb), so that
// cluster, rpc, proxy, client and the commands can all use it.
package auth
