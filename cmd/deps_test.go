// Package cmd_test checks what the programs link.
package cmd_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestClientSideLinksNoEngine pins that the client library and the programs
// that only talk to a cluster (taskctl, taskproxy, taskbench) do not link the
// node's engine: no Pebble, no hashicorp/raft, none of the packages that run
// a node. Such a dependency creeps in through one shared constant or flag
// helper (limits belong in api/limits), and then every client build carries
// a storage engine.
func TestClientSideLinksNoEngine(t *testing.T) {
	const mod = "github.com/e1158ecb/taskstore/"
	forbidden := func(pkg string) bool {
		switch pkg {
		case mod + "cluster", mod + "fsm", mod + "fsm/ondisk", mod + "rpc", mod + "server":
			return true
		}
		return strings.HasPrefix(pkg, "github.com/cockroachdb/pebble") || strings.HasPrefix(pkg, "github.com/hashicorp/raft")
	}
	for _, pkg := range []string{mod + "client", mod + "cmd/taskctl", mod + "cmd/taskproxy", mod + "cmd/taskbench", mod + "proxy"} {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 10 {
			t.Fatalf("go list -deps %s listed only %q", pkg, deps)
		}
		for _, d := range deps {
			if forbidden(d) {
				t.Errorf("%s links %s", pkg, d)
			}
		}
	}
}
