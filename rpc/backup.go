package rpc

import (
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// backupChunk is the size of the data of one BackupChunk: well under the
// 4 MiB a gRPC client receives by default.
const backupChunk = 1 << 20

// Backup implements Admin.Backup: a shard's state from its leader, or
// (shard 0) the cluster map from the meta leader, to which any node
// forwards it.
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
	c, err := srv.node.BackupShard(ctx, req.Shard)
	if err != nil {
		return toStatus(err)
	}
	defer c.Release()
	srv.log.Info("backup: copying a shard", "shard", c.Shard, "index", c.Index, "tasks", c.Tasks, "held", c.Took)
	cw := &chunkWriter{stream: stream, info: &taskstorepb.BackupInfo{Shard: c.Shard, Index: c.Index, Tasks: c.Tasks,
		Node: srv.node.ID(), ClusterId: srv.node.Map().ClusterId}}
	if err := c.Stream(cw); err != nil {
		return err
	}
	return cw.flush()
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
