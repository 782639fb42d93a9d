package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// backupWait is how long a copy may stream: a shard of many gigabytes
// takes minutes. The caller's context bounds it too.
const backupWait = 24 * time.Hour

// Backup streams a copy of shard's state machine (shard 0: the cluster
// map) into w and returns what the copy holds. The call goes to the
// shard's leader (the map's to the meta leader), which checks its
// leadership and redirects the call to its followers with its commit
// index: a follower that has applied it streams the copy straight to the
// caller (the leader's CPU stays with its writers); when none does within
// followerWindow, the leader streams it. Either way the copy holds every
// write acknowledged before the call; BackupInfo.Node names the node that
// streamed it. Backup retries (leader changes, unavailable nodes) until the
// copy's first bytes reach w; a copy that breaks after that is an error,
// since w then holds part of it. It needs the admin role. Package backup
// writes the copies into a backup file (taskctl backup create).
func (c *Client) Backup(ctx context.Context, shard uint32, w io.Writer) (*taskstorepb.BackupInfo, error) {
	return c.BackupStream(ctx, shard, nil, w)
}

// followerWindow is how long Backup tries a shard's followers, in turn,
// before it asks the leader for the copy.
const followerWindow = 5 * time.Second

// followerFirst bounds one follower's answer (its first chunk) within the
// window: a follower that hangs does not take the whole window from the
// others.
const followerFirst = 2500 * time.Millisecond

// BackupStream is Backup that also calls onInfo (unless nil) with what the
// copy holds before its first bytes reach w: a proxy relays it ahead of
// the bytes. A retried copy calls it again.
func (c *Client) BackupStream(ctx context.Context, shard uint32, onInfo func(*taskstorepb.BackupInfo), w io.Writer) (*taskstorepb.BackupInfo, error) {
	bc := &backupCopy{c: c, shard: shard, onInfo: onInfo, w: w}
	if shard == 0 || c.opts.proxyOnly {
		// The map comes from the meta leader; a proxy follows the
		// redirect itself.
		return bc.call(ctx, target{anyNode: true}, &taskstorepb.BackupRequest{Shard: shard}, nil)
	}
	var redirect *taskstorepb.BackupRedirect
	info, err := bc.call(ctx, target{shard: shard}, &taskstorepb.BackupRequest{Shard: shard, Follow: true}, &redirect)
	if err != nil || redirect == nil {
		return info, err // a leader without followers streamed it
	}
	info, err = bc.followers(ctx, redirect)
	var broken *BackupBrokenError
	if err == nil || errors.As(err, &broken) || ctx.Err() != nil {
		return info, err
	}
	c.log.Info("backup: no follower took the copy; the leader streams it", "shard", shard, "min_index", redirect.MinIndex, "err", err)
	// The leader (whichever node leads now) has applied what it committed.
	return bc.call(ctx, target{shard: shard}, &taskstorepb.BackupRequest{Shard: shard, MinIndex: redirect.MinIndex}, nil)
}

// backupCopy is one shard's copy on its way into w: the calls that find a
// node to stream it (the leader, a follower it redirects to), and where its
// first message and its bytes go.
type backupCopy struct {
	c      *Client
	shard  uint32
	onInfo func(*taskstorepb.BackupInfo)
	w      io.Writer
}

// followers asks the redirect's followers in turn for the copy until one
// streams it or followerWindow has passed.
func (b *backupCopy) followers(ctx context.Context, r *taskstorepb.BackupRedirect) (*taskstorepb.BackupInfo, error) {
	shard := b.shard
	if len(r.Replicas) == 0 {
		return nil, errors.New("the redirect names no follower")
	}
	deadline := time.Now().Add(followerWindow)
	var lastErr error
	for round := 0; ; round++ {
		for _, f := range r.Replicas {
			left := time.Until(deadline)
			if left <= 0 {
				return nil, fmt.Errorf("no follower streamed the copy within %v: %w", followerWindow, lastErr)
			}
			info, err := b.follower(ctx, f.Address, &taskstorepb.BackupRequest{Shard: shard, MinIndex: r.MinIndex, Follow: true},
				min(left, followerFirst))
			if err == nil {
				return info, nil
			}
			var broken *BackupBrokenError
			if errors.As(err, &broken) || ctx.Err() != nil {
				return nil, err
			}
			if errors.Is(err, ErrPermission) || status.Code(err) == codes.PermissionDenied || status.Code(err) == codes.Unauthenticated {
				return nil, err // the leader would refuse the caller too
			}
			b.c.log.Debug("backup: a follower did not take the copy", "shard", shard, "follower", f.Id, "err", err)
			lastErr = fmt.Errorf("%s: %w", f.Id, err)
		}
		// Each follower is behind or out of reach: a behind one catches
		// up within heartbeats.
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(min(100*time.Millisecond<<min(round, 3), time.Until(deadline))):
		}
	}
}

// follower asks the node at addr for the copy; first bounds the wait for
// its first chunk.
func (b *backupCopy) follower(ctx context.Context, addr string, req *taskstorepb.BackupRequest, first time.Duration) (*taskstorepb.BackupInfo, error) {
	cc, err := b.c.conn(addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := taskstorepb.NewAdminClient(cc).Backup(ctx, req, b.c.backupCallOptions()...)
	if err != nil {
		return nil, err
	}
	timer := time.AfterFunc(first, cancel)
	m, err := stream.Recv()
	if !timer.Stop() {
		return nil, fmt.Errorf("no answer within %v", first)
	}
	if err != nil {
		return nil, err
	}
	if m.Info == nil || m.Info.Index < req.MinIndex {
		return nil, fmt.Errorf("the copy begins with %v, not a copy at or past index %d", m.Info, req.MinIndex)
	}
	return m.Info, copyBackup(req.Shard, stream, m, b.onInfo, b.w)
}

// call asks t for a copy with req and streams it into w. With redirect
// set, a redirect is stored there instead (nothing is written).
func (b *backupCopy) call(ctx context.Context, t target, req *taskstorepb.BackupRequest, redirect **taskstorepb.BackupRedirect) (*taskstorepb.BackupInfo, error) {
	var info *taskstorepb.BackupInfo
	err := b.c.call(ctx, "Backup", t, backupWait, func(ctx context.Context, cc *grpc.ClientConn) error {
		stream, err := taskstorepb.NewAdminClient(cc).Backup(ctx, req, b.c.backupCallOptions()...)
		if err != nil {
			return err
		}
		first, err := stream.Recv()
		if err != nil {
			return err
		}
		if first.Redirect != nil && redirect != nil {
			*redirect = first.Redirect
			return nil
		}
		if first.Info == nil {
			return errors.New("backup: the node's answer does not begin with what the copy holds")
		}
		if first.Info.Index < req.MinIndex {
			return fmt.Errorf("backup: the copy begins with %v, not a copy at or past index %d", first.Info, req.MinIndex)
		}
		info = first.Info
		return copyBackup(req.Shard, stream, first, b.onInfo, b.w)
	})
	if err != nil {
		return nil, err
	}
	return info, nil
}

// copyBackup writes a copy's stream into w, from its first message on.
// An error before any byte reached w is the stream's own (the caller may
// retry); after, a BackupBrokenError.
func copyBackup(shard uint32, stream grpc.ServerStreamingClient[taskstorepb.BackupChunk], m *taskstorepb.BackupChunk, onInfo func(*taskstorepb.BackupInfo), w io.Writer) error {
	if onInfo != nil {
		onInfo(m.Info)
	}
	var written int64
	for {
		if len(m.Data) > 0 {
			n, err := w.Write(m.Data)
			written += int64(n)
			if err != nil {
				return &BackupBrokenError{Shard: shard, Written: written, Err: err}
			}
		}
		var err error
		m, err = stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if written == 0 {
				return err // nothing written: retry
			}
			return &BackupBrokenError{Shard: shard, Written: written, Err: err}
		}
	}
}

// BackupBrokenError is a copy that broke after part of it was written: it
// is not retried, since the writer holds part of it. It does not unwrap to
// the cause's gRPC status, so that the retry loop leaves it alone.
type BackupBrokenError struct {
	Shard   uint32
	Written int64
	Err     error
}

func (e *BackupBrokenError) Error() string {
	return fmt.Sprintf("backup: the copy of shard %d broke after %d bytes: %v", e.Shard, e.Written, e.Err)
}
