package statuspage

import (
	"context"
	"strings"
	"testing"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// preferredFake is fake with shard 1 preferring b and shard 3 c (which
// sends no report).
type preferredFake struct{ fake }

func (f preferredFake) Status(ctx context.Context, localOnly bool) *taskstorepb.StatusResponse {
	st := f.fake.Status(ctx, localOnly)
	st.Shards[0].PreferredLeader = "b"
	st.Shards[2].PreferredLeader = "c"
	return st
}

// TestOverviewMarksThePreferredLeader: each shard's preferred replica is
// marked (the replica list's order means nothing), whether or not it
// reported.
func TestOverviewMarksThePreferredLeader(t *testing.T) {
	code, body := fetch(t, New(preferredFake{}, fake{}), "/")
	mark := ` <small class="muted" title="preferred leader: leadership returns here while it is healthy">preferred</small></td>`
	if code != 200 || strings.Count(body, mark) != 2 || !strings.Contains(body, "<td>b"+mark) || !strings.Contains(body, "<td>c"+mark) {
		t.Fatalf("overview %d does not mark b and c as preferred:\n%s", code, body)
	}
	if _, body := fetch(t, New(fake{}, fake{}), "/"); strings.Contains(body, mark) {
		t.Fatal("a shard without a preferred leader is marked")
	}
}
