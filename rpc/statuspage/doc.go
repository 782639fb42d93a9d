// Package statuspage serves a node's HTML status page on its --http
// address, next to /metrics, /healthz, /readyz and /debug/pprof/: pages that
// read, and for an authenticated admin a queue's actions (POST /actions).
//
// Pages (html/template, templates and CSS embedded, no JavaScript; the
// cluster and queue lists refresh themselves with a meta refresh):
//
//   - /                               the cluster as this node sees it: nodes
//     (addresses, state, gossip health, shards, leaderships) and shards
//     (leader, term, replicas and each replica's commit, applied and last
//     index with its lag behind the most advanced replica highlighted);
//   - /queues?prefix=P                the queues of the shards hosted on this
//     node, sorted by name, with depth (total, available, claimed, delayed),
//     oldest available age and, when the node reports them, enqueue, claim and
//     commit rates and the average time from claim to commit;
//   - /queues/{name}?page=T           a queue's tasks, a page at a time; values
//     that are printable UTF-8 are shown as text, truncated, others as a size
//     and a hex preview, each with a download link;
//   - /queues/{name}/tasks/{id}/value the raw bytes of a task's value
//     (application/octet-stream, as an attachment).
//
// {name} is one path segment, escaped (url.PathEscape, so '/' is %2F); the
// page's own links are always written that way. For typing convenience a
// name with literal slashes (/queues/grp/q) is accepted too, and
// /queues/grp/q/tasks/ID/value then addresses a value. Every other path is
// 404.
//
// Reads are stale (from this node's replicas, which may trail their leaders
// slightly) so the page works on every node, leader or not: GET and HEAD
// read, every other method gets 405, but for one path:
//
//   - POST /actions                   a queue's page's forms (actions.go):
//     pause, resume, move unclaimed tasks to another queue of the group,
//     purge with the queue's name typed as confirmation, delete one task.
//     Only for an authenticated admin (Options.Actions set and an admin
//     principal in the request's context, which auth's RequireAdminHTTP
//     puts there), with a form token signed for that principal and a
//     same-origin post; everyone else gets the page read-only, and 403.
//     A done action redirects (303) to a page that says what it did.
//
// A queue whose shard is not hosted on this node is reported with a link
// to a node that hosts it.
//
// The handler depends on two small interfaces, satisfied by *cluster.Node
// (Status) and *rpc.Server (Queues, Tasks), so that package rpc can mount it
// without an import cycle.
package statuspage
