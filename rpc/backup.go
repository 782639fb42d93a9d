package rpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/cluster"
)

// backupChunk is the size of the data of one BackupChunk: well under the
// 4 MiB a gRPC client receives by default.
const backupChunk = 1 << 20

// Backup implements Admin.Backup: a shard's state as its leader has it
// after a read barrier, streamed by a follower that has applied the
// leader's commit index (else by the leader), or (shard 0) the cluster map
// from the meta leader, to which any node forwards it. A caller that
// follows (BackupRequest.follow) gets a redirect to the followers instead
// of the relayed stream, and asks them with min_index itself.
func (srv *Server) Backup(req *taskstorepb.BackupRequest, stream grpc.ServerStreamingServer[taskstorepb.BackupChunk]) error {
	ctx := stream.Context()
	if req.Shard == 0 {
		cm, err := srv.node.BackupMap(ctx)
		if err != nil {
			if leader, fctx, ok := srv.metaLeader(ctx, err); ok {
				return relayBackup(leader.Backup(fctx, req))(stream)
			}
			return toStatus(err)
		}
		data, err := proto.Marshal(cm)
		if err != nil {
			return toStatus(err)
		}
		cw := &chunkWriter{stream: stream, info: &taskstorepb.BackupInfo{Index: cm.Epoch, Node: srv.node.ID(), ClusterId: cm.ClusterId}}
		if _, err := cw.Write(data); err != nil {
			return err
		}
		return cw.flush()
	}
	if req.MinIndex > 0 {
		// A shard's leader, or a client it redirected, asks this replica
		// for the copy.
		if refuse := srv.copyRefusal.Load(); refuse != nil {
			if err := (*refuse)(ctx); err != nil {
				return err
			}
		}
		c, err := srv.node.BackupShardAt(ctx, req.Shard, req.MinIndex, followerCatchUp)
		if errors.Is(err, cluster.ErrCopyBehind) {
			return status.Error(codes.FailedPrecondition, err.Error())
		}
		if err != nil {
			return toStatus(err)
		}
		return srv.sendCopy(c, stream)
	}
	fence, followers, err := srv.node.BackupFence(ctx, req.Shard)
	if err != nil {
		return toStatus(err)
	}
	if req.Follow && len(followers) > 0 {
		// The caller asks a follower itself: the stream then spares this
		// node's CPU entirely, the relay included.
		r := &taskstorepb.BackupRedirect{MinIndex: fence}
		for _, f := range followers {
			r.Replicas = append(r.Replicas, &taskstorepb.Replica{Id: f.ID, Address: f.Address})
		}
		srv.log.Info("backup: the copy is redirected to a follower", "shard", req.Shard, "fence", fence, "followers", len(followers))
		return stream.Send(&taskstorepb.BackupChunk{Redirect: r})
	}
	// A caught-up follower streams the copy, which spares the leader the
	// stream's CPU and garbage; the first that answers does it.
	for _, f := range followers {
		sent, err := srv.backupFrom(ctx, f, req.Shard, fence, stream)
		if sent {
			return err
		}
		srv.log.Info("backup: a follower did not take the copy; the next or the leader does", "shard", req.Shard, "follower", f.ID, "fence", fence, "err", err)
	}
	c, err := srv.node.BackupShardAt(ctx, req.Shard, fence, leaderCatchUp)
	if err != nil {
		return toStatus(err)
	}
	return srv.sendCopy(c, stream)
}

// followerCatchUp is how long a follower asked for a copy waits to apply
// the leader's fence: a follower learns the commit index with the next
// append or heartbeat; one that needs longer is behind, and the leader
// copies instead.
const followerCatchUp = 200 * time.Millisecond

// followerFirst bounds how long a leader waits for a follower's first
// chunk (the follower's wait for the fence plus taking its view).
const followerFirst = 5 * time.Second

// leaderCatchUp bounds the leader's wait to apply its own commit index
// (it applies what it committed within milliseconds).
const leaderCatchUp = 10 * time.Second

// sendCopy streams a shard's copy taken on this node.
func (srv *Server) sendCopy(c *cluster.ShardCopy, stream grpc.ServerStreamingServer[taskstorepb.BackupChunk]) error {
	defer c.Release()
	srv.log.Info("backup: copying a shard", "shard", c.Shard, "index", c.Index, "tasks", c.Tasks, "held", c.Took)
	cw := &chunkWriter{stream: stream, info: &taskstorepb.BackupInfo{Shard: c.Shard, Index: c.Index, Tasks: c.Tasks,
		Node: srv.node.ID(), ClusterId: srv.node.Map().ClusterId}}
	if err := c.Stream(cw); err != nil {
		return err
	}
	return cw.flush()
}

// backupFrom asks follower f for shard's copy at or past fence and relays
// it. sent reports whether anything reached stream: if not, the caller
// copies elsewhere.
func (srv *Server) backupFrom(ctx context.Context, f cluster.BackupReplica, shard uint32, fence uint64, stream grpc.ServerStreamingServer[taskstorepb.BackupChunk]) (sent bool, err error) {
	conn, err := srv.node.PeerConn(f.Address)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	from, err := taskstorepb.NewAdminClient(conn).Backup(metadata.AppendToOutgoingContext(ctx, forwardedKey, "1"),
		&taskstorepb.BackupRequest{Shard: shard, MinIndex: fence})
	if err != nil {
		return false, err
	}
	// A follower that cannot be reached or hangs must not hold the backup:
	// past followerFirst without the copy's first bytes, the leader goes on.
	timer := time.AfterFunc(followerFirst, cancel)
	first, err := from.Recv()
	if !timer.Stop() {
		return false, fmt.Errorf("no answer within %v", followerFirst)
	}
	if err != nil {
		return false, err
	}
	if first.Info == nil || first.Info.Index < fence {
		return false, fmt.Errorf("the follower's copy begins with %v, below the fence %d", first.Info, fence)
	}
	if err := stream.Send(first); err != nil {
		return true, err
	}
	return true, relayBackup(from, nil)(stream)
}

// relayBackup passes a forwarded Backup's stream on.
func relayBackup(from grpc.ServerStreamingClient[taskstorepb.BackupChunk], err error) func(grpc.ServerStreamingServer[taskstorepb.BackupChunk]) error {
	return func(to grpc.ServerStreamingServer[taskstorepb.BackupChunk]) error {
		if err != nil {
			return err
		}
		for {
			m, err := from.Recv()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			if err := to.Send(m); err != nil {
				return err
			}
		}
	}
}

// chunkWriter sends what is written in BackupChunks of backupChunk bytes,
// the first carrying info.
type chunkWriter struct {
	stream grpc.ServerStreamingServer[taskstorepb.BackupChunk]
	info   *taskstorepb.BackupInfo
	buf    []byte
}

func (w *chunkWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if w.buf == nil {
			w.buf = make([]byte, 0, backupChunk)
		}
		k := min(len(p), backupChunk-len(w.buf))
		w.buf = append(w.buf, p[:k]...)
		p = p[k:]
		if len(w.buf) == backupChunk {
			if err := w.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

// flush sends what is buffered (and the info, if not sent yet).
func (w *chunkWriter) flush() error {
	if len(w.buf) == 0 && w.info == nil {
		return nil
	}
	err := w.stream.Send(&taskstorepb.BackupChunk{Info: w.info, Data: w.buf})
	w.info, w.buf = nil, w.buf[:0]
	return err
}
