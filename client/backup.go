package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// backupWait is how long a copy may stream: a shard of many gigabytes
// takes minutes. The caller's context bounds it too.
const backupWait = 24 * time.Hour

// Backup streams a copy of shard's state machine (shard 0: the cluster
// map) into w and returns what the copy holds. The call goes to the
// shard's leader (the map's to the meta leader), which checks its
// leadership and has a follower that applied its commit index stream the
// copy (else streams it itself), so it holds every write acknowledged
// before the call; BackupInfo.Node names the node that streamed it. Backup
// retries (leader changes, unavailable nodes) until the copy's first bytes
// reach w; a copy that breaks after that is an error, since w then holds
// part of it. It needs the admin role. Package backup writes the copies
// into a backup file (taskctl backup create).
func (c *Client) Backup(ctx context.Context, shard uint32, w io.Writer) (*taskstorepb.BackupInfo, error) {
	return c.BackupStream(ctx, shard, nil, w)
}

// BackupStream is Backup that also calls onInfo (unless nil) with what the
// copy holds before its first bytes reach w: a proxy relays it ahead of
// the bytes. A retried copy calls it again.
func (c *Client) BackupStream(ctx context.Context, shard uint32, onInfo func(*taskstorepb.BackupInfo), w io.Writer) (*taskstorepb.BackupInfo, error) {
	t := target{shard: shard}
	if shard == 0 || c.opts.proxyOnly {
		t = target{anyNode: true}
	}
	var info *taskstorepb.BackupInfo
	err := c.call(ctx, "Backup", t, backupWait, func(ctx context.Context, cc *grpc.ClientConn) error {
		stream, err := taskstorepb.NewAdminClient(cc).Backup(ctx, &taskstorepb.BackupRequest{Shard: shard})
		if err != nil {
			return err
		}
		first, err := stream.Recv()
		if err != nil {
			return err
		}
		if first.Info == nil {
			return errors.New("backup: the node's answer does not begin with what the copy holds")
		}
		info = first.Info
		if onInfo != nil {
			onInfo(info)
		}
		var written int64
		m := first
		for {
			if len(m.Data) > 0 {
				n, err := w.Write(m.Data)
				written += int64(n)
				if err != nil {
					return &BackupBrokenError{Shard: shard, Written: written, Err: err}
				}
			}
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
	})
	if err != nil {
		return nil, err
	}
	return info, nil
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
