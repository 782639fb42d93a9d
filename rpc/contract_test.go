package rpc_test

import (
	"maps"
	"testing"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// TestRefErrorCategoriesMatch pins the enum the server converts with an
// integer cast (errors.go, metrics.go): every category of the log's
// fsm.proto has the same number and name in the API's taskstore.proto, and
// the other way round. A category added to one file alone fails here.
func TestRefErrorCategoriesMatch(t *testing.T) {
	log, api := fsmpb.RefError_Category_name, taskstorepb.RefError_Category_name
	if !maps.Equal(log, api) {
		t.Fatalf("RefError categories differ:\n fsm.proto:       %v\n taskstore.proto: %v", log, api)
	}
}

// FuzzGroupRuleAgrees pins the consistency-group rule, written twice: the
// state machine's (which tasks a Modify may touch) and the router's (which
// shard a request goes to) must agree on every queue name.
func FuzzGroupRuleAgrees(f *testing.F) {
	for _, q := range []string{"", "a", "a/b", "/a", "a/", "a/b/c", "//", "é/ü", "a\x00/b"} {
		f.Add(q)
	}
	f.Fuzz(func(t *testing.T, q string) {
		if fsm.GroupOf(q) != taskstorepb.GroupOf(q) {
			t.Fatalf("group of %q: state machine %q, router %q", q, fsm.GroupOf(q), taskstorepb.GroupOf(q))
		}
	})
}
