// Package backup is the file format of a cluster backup: the cluster map
// and every shard's state as of one Raft index of its log, each in a part
// with its own checksum, then a manifest and a checksum of the whole file.
// `taskctl backup create` writes it, `taskctl backup verify` checks it and
// `taskstored restore` prepares a new cluster's data directories from it
// (cluster.Restore). DESIGN.md has the format and the decisions.
package backup
