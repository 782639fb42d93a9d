package rpc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/fsm"
	"github.com/e1158ecb/taskstore/testing/harness"
)

// backupCopy calls Admin.Backup on conn and returns the copy's info and
// bytes.
func backupCopy(ctx context.Context, conn *grpc.ClientConn, req *taskstorepb.BackupRequest) (*taskstorepb.BackupInfo, []byte, error) {
	stream, err := taskstorepb.NewAdminClient(conn).Backup(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	var info *taskstorepb.BackupInfo
	var data bytes.Buffer
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return info, data.Bytes(), nil
		}
		if err != nil {
			return nil, nil, err
		}
		if m.Info != nil {
			info = m.Info
		}
		data.Write(m.Data)
	}
}

// TestBackupFromCaughtUpFollower: a shard's copy asked of its leader is
// streamed by a follower that has applied the leader's commit index, and
// holds every write acknowledged before; a follower asked for an index it
// has not applied refuses (FAILED_PRECONDITION) instead of copying an
// older state; a follower cut off from the leader (behind) is passed
// over: the other follower streams, with every write.
func TestBackupFromCaughtUpFollower(t *testing.T) {
	const shard = 1
	f := newBackupFixture(t)
	c, ctx, lead, insert, check := f.c, f.ctx, f.lead, f.insert, f.check

	insert(40, "a")
	leader := c.Nodes[lead].Server().Node.Shard(shard)
	commit := leader.Raft().CommitIndex()
	info, data, err := backupCopy(ctx, c.Conn(lead), &taskstorepb.BackupRequest{Shard: shard})
	if err != nil {
		t.Fatal(err)
	}
	if info.Node == c.Nodes[lead].ID {
		t.Errorf("the leader %s streamed the copy; its followers are caught up", info.Node)
	}
	check(info, data, 40, commit)

	var followers []int
	for i := range c.Nodes {
		if i != lead {
			followers = append(followers, i)
		}
	}
	_, _, err = backupCopy(ctx, c.Conn(followers[0]), &taskstorepb.BackupRequest{Shard: shard, MinIndex: commit + 1_000_000})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a follower asked for an index it has not applied: %v, want FailedPrecondition", err)
	}

	// The first follower is cut off from the leader: its log stops.
	behind, ahead := c.Nodes[followers[0]].ID, c.Nodes[followers[1]].ID
	c.Network().Cut(c.Nodes[lead].ID, behind)
	c.Network().Cut(behind, c.Nodes[lead].ID)
	insert(30, "b")
	commit = leader.Raft().CommitIndex()
	info, data, err = backupCopy(ctx, c.Conn(lead), &taskstorepb.BackupRequest{Shard: shard})
	if err != nil {
		t.Fatal(err)
	}
	if info.Node != ahead {
		t.Errorf("copy streamed by %s, want the caught-up follower %s (%s is behind)", info.Node, ahead, behind)
	}
	check(info, data, 70, commit)
}

// TestBackupLeaderCopiesWhenFollowersRefuse: when every follower refuses
// the copy (one behind: FAILED_PRECONDITION; one silent until the leader
// gives up on it), the leader streams the copy itself, with every write
// acknowledged before the call.
func TestBackupLeaderCopiesWhenFollowersRefuse(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: 2})
	c.WaitReady()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const shard = 1
	lead := c.Leader(shard)
	if lead < 0 {
		t.Fatal("no leader of shard 1")
	}
	req := &taskstorepb.ModifyRequest{}
	for i := range 25 {
		req.Inserts = append(req.Inserts, &taskstorepb.TaskInsert{Queue: "g/q", Id: fmt.Sprintf("t%03d", i), Value: []byte("v")})
	}
	if _, err := taskstorepb.NewTaskStoreClient(c.Conn(lead)).Modify(ctx, req); err != nil {
		t.Fatal(err)
	}
	var asked []string
	var refusals []func(ctx context.Context) error
	refusals = append(refusals,
		func(context.Context) error { return status.Error(codes.FailedPrecondition, "behind (test)") },
		func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }) // silent
	for i, n := range c.Nodes {
		if i == lead {
			continue
		}
		refuse := refusals[len(asked)]
		id := n.ID
		asked = append(asked, id)
		undo := n.Server().RPC.RefuseBackupCopies(func(ctx context.Context) error {
			t.Logf("follower %s asked for the copy: refuses", id)
			return refuse(ctx)
		})
		defer undo()
	}
	commit := c.Nodes[lead].Server().Node.Shard(shard).Raft().CommitIndex()
	info, data, err := backupCopy(ctx, c.Conn(lead), &taskstorepb.BackupRequest{Shard: shard})
	if err != nil {
		t.Fatal(err)
	}
	if info.Node != c.Nodes[lead].ID {
		t.Errorf("copy streamed by %s, want the leader %s (its followers %v refuse)", info.Node, c.Nodes[lead].ID, asked)
	}
	if info.Tasks != 25 || info.Index < commit {
		t.Fatalf("copy %v: want 25 tasks at an index at or past %d", info, commit)
	}
	m := fsm.New(fsm.Options{})
	if err := m.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
		t.Fatal(err)
	}
	if got := m.TaskCount(); got != 25 {
		t.Fatalf("the copy restores to %d tasks, want 25", got)
	}
}

// TestBackupRedirectToFollower: a shard's leader asked with follow answers
// a redirect (its commit index, its followers) and nothing else; the
// client follows it and a caught-up follower streams the copy, with every
// write acknowledged before; a follower asked for an index it has not
// applied refuses (FAILED_PRECONDITION); and when no follower takes the
// copy (one stopped, one refusing as behind), the client falls back to
// the leader after trying them.
func TestBackupRedirectToFollower(t *testing.T) {
	const shard = 1
	f := newBackupFixture(t)
	c, ctx, lead, insert, check := f.c, f.ctx, f.lead, f.insert, f.check
	var followers []int
	for i := range c.Nodes {
		if i != lead {
			followers = append(followers, i)
		}
	}

	insert(40, "a")
	leader := c.Nodes[lead].Server().Node.Shard(shard)
	commit := leader.Raft().CommitIndex()
	stream, err := taskstorepb.NewAdminClient(c.Conn(lead)).Backup(ctx, &taskstorepb.BackupRequest{Shard: shard, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	r := first.GetRedirect()
	if r == nil || first.Info != nil || len(first.Data) > 0 {
		t.Fatalf("the leader asked with follow answered %v, want only a redirect", first)
	}
	if r.MinIndex < commit {
		t.Errorf("redirect to index %d, below the leader's commit index %d before the call", r.MinIndex, commit)
	}
	var named []string
	for _, rep := range r.Replicas {
		named = append(named, rep.Id)
	}
	want := []string{c.Nodes[followers[0]].ID, c.Nodes[followers[1]].ID}
	if !sameSet(named, want) {
		t.Errorf("redirect names %v, want the followers %v", named, want)
	}
	if m, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("after the redirect: %v, %v; want the end of the stream", m, err)
	}

	cl, err := client.Dial(ctx, strings.Join(c.Endpoints(), ","), client.WithAttemptTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var buf bytes.Buffer
	info, err := cl.Backup(ctx, shard, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if info.Node == c.Nodes[lead].ID {
		t.Errorf("the leader %s streamed the copy; its followers are caught up", info.Node)
	}
	check(info, buf.Bytes(), 40, commit)

	_, _, err = backupCopy(ctx, c.Conn(followers[0]), &taskstorepb.BackupRequest{Shard: shard, MinIndex: commit + 1_000_000, Follow: true})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a follower asked for an index it has not applied: %v, want FailedPrecondition", err)
	}

	// No follower takes the copy: one is stopped (unreachable), the
	// other answers that it is behind. The client tries them, then the
	// leader streams the copy.
	c.Stop(followers[0])
	var asked atomic.Int32
	undo := c.Nodes[followers[1]].Server().RPC.RefuseBackupCopies(func(context.Context) error {
		asked.Add(1)
		return status.Error(codes.FailedPrecondition, "behind (test)")
	})
	defer undo()
	insert(30, "b")
	commit = leader.Raft().CommitIndex()
	buf.Reset()
	start := time.Now()
	info, err = cl.Backup(ctx, shard, &buf)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fell back to the leader after %v; the refusing follower was asked %d times", time.Since(start).Round(time.Millisecond), asked.Load())
	if info.Node != c.Nodes[lead].ID {
		t.Errorf("copy streamed by %s, want the leader %s (one follower stopped, one behind)", info.Node, c.Nodes[lead].ID)
	}
	if asked.Load() == 0 {
		t.Error("the client never asked the follower that is up")
	}
	check(info, buf.Bytes(), 70, commit)
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// backupFixture is a cluster of three nodes and one shard (1), a context
// for the test, the shard's leader, inserts at that leader and a check of
// a copy.
type backupFixture struct {
	t    *testing.T
	c    *harness.Cluster
	ctx  context.Context
	lead int
}

func newBackupFixture(t *testing.T) *backupFixture {
	t.Helper()
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: 2})
	c.WaitReady()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	lead := c.Leader(1)
	if lead < 0 {
		t.Fatal("no leader of shard 1")
	}
	return &backupFixture{t: t, c: c, ctx: ctx, lead: lead}
}

// insert writes n tasks of queue g/q, ids prefix000 on, at the leader.
func (f *backupFixture) insert(n int, prefix string) {
	f.t.Helper()
	req := &taskstorepb.ModifyRequest{}
	for i := range n {
		req.Inserts = append(req.Inserts, &taskstorepb.TaskInsert{Queue: "g/q", Id: fmt.Sprintf("%s%03d", prefix, i), Value: []byte("v")})
	}
	if _, err := taskstorepb.NewTaskStoreClient(f.c.Conn(f.lead)).Modify(f.ctx, req); err != nil {
		f.t.Fatal(err)
	}
}

// check fails the test unless the copy says it holds tasks tasks at an
// index at or past commit and restores to that many.
func (f *backupFixture) check(info *taskstorepb.BackupInfo, data []byte, tasks uint64, commit uint64) {
	f.t.Helper()
	if info == nil || info.Tasks != tasks || info.Index < commit {
		f.t.Fatalf("copy %v: want %d tasks at an index at or past %d", info, tasks, commit)
	}
	m := fsm.New(fsm.Options{})
	if err := m.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
		f.t.Fatal(err)
	}
	if got := m.TaskCount(); uint64(got) != tasks {
		f.t.Fatalf("the copy restores to %d tasks, want %d", got, tasks)
	}
}
