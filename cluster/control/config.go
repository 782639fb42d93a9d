package control

import (
	"fmt"
	"slices"

	"github.com/e1158ecb/taskstore/cluster/metapb"
)

// Each shard's leader brings its group's Raft configuration to the replica
// set the map records, one change at a time (the runtime makes each with
// the previous configuration's index, so two cannot both apply). In
// order: remove a dead voter the map no longer wants, add new replicas as
// non-voters, promote a non-voter once it has caught up, and only then
// remove the surplus, handing leadership off first when the surplus is the
// leader itself.

// Server is a member of a group's Raft configuration.
type Server struct {
	ID, Address string
	Voter       bool
}

// ConfigKind is the next change to a group's Raft configuration.
type ConfigKind int

const (
	// ConfigNone: the configuration is the map's replica set.
	ConfigNone ConfigKind = iota
	// ConfigRemoveDead: remove ID, a dead server the map does not want.
	ConfigRemoveDead
	// ConfigAddNonvoter: add ID at Address as a non-voter.
	ConfigAddNonvoter
	// ConfigPromote: make ID (at Address) a voter, once it has caught up;
	// until then, wait.
	ConfigPromote
	// ConfigHandOff: the leader itself is surplus: hand leadership to ID
	// (at Address, from the map) first.
	ConfigHandOff
	// ConfigRemove: remove ID, a server the map does not want.
	ConfigRemove
)

// ConfigChange is one change to a group's Raft configuration.
type ConfigChange struct {
	Kind        ConfigKind
	ID, Address string
}

// NextConfigChange is the next change that brings the configuration
// servers of shard sh's group, led by self, to the map's replica set.
// dead reports whether gossip sees a node dead. A new replica the map has
// no address for is an error. Deterministic in its inputs.
func NextConfigChange(cm *metapb.ClusterMap, sh *metapb.Shard, servers []Server, self string, dead func(id string) bool) (ConfigChange, error) {
	in := func(id string) *Server {
		for i := range servers {
			if servers[i].ID == id {
				return &servers[i]
			}
		}
		return nil
	}
	addrOf := func(id string) string {
		if node := FindNode(cm, id); node != nil {
			return node.Address
		}
		return ""
	}
	for _, srv := range servers {
		if !slices.Contains(sh.Replicas, srv.ID) && srv.ID != self && dead(srv.ID) {
			return ConfigChange{Kind: ConfigRemoveDead, ID: srv.ID}, nil
		}
	}
	for _, id := range sh.Replicas {
		if in(id) == nil {
			addr := addrOf(id)
			if addr == "" {
				return ConfigChange{}, fmt.Errorf("replica %s has no address in the map", id)
			}
			return ConfigChange{Kind: ConfigAddNonvoter, ID: id, Address: addr}, nil
		}
	}
	for _, id := range sh.Replicas {
		if srv := in(id); srv != nil && !srv.Voter {
			return ConfigChange{Kind: ConfigPromote, ID: id, Address: srv.Address}, nil
		}
	}
	for _, srv := range servers {
		if slices.Contains(sh.Replicas, srv.ID) {
			continue
		}
		if srv.ID == self {
			return ConfigChange{Kind: ConfigHandOff, ID: sh.PreferredLeader, Address: addrOf(sh.PreferredLeader)}, nil
		}
		return ConfigChange{Kind: ConfigRemove, ID: srv.ID}, nil
	}
	return ConfigChange{}, nil
}
