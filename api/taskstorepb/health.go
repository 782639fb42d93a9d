package taskstorepb

// HealthyReplicas counts the replicas of a shard, as the map places them,
// that reported in as its leader or a follower: a replica whose node is
// down or unreachable, one still catching up (nonvoter) and one stopped
// because it diverged do not count. A shard with healthy < placed is
// under-replicated: it survives fewer failures than it was placed for.
func HealthyReplicas(s *ShardStatus) (healthy, placed int) {
	role := map[string]string{}
	for _, r := range s.GetReplicaStatus() {
		role[r.GetNode()] = r.GetRole()
	}
	for _, id := range s.GetReplicas() {
		if r := role[id]; r == "leader" || r == "follower" {
			healthy++
		}
	}
	return healthy, len(s.GetReplicas())
}
