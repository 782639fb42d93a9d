package rpc

import "context"

// RefuseBackupCopies makes the node, as a follower asked for a backup's
// copy, call refuse first and answer its error instead of copying (nil:
// copy). undo ends it.
func (srv *Server) RefuseBackupCopies(refuse func(ctx context.Context) error) (undo func()) {
	srv.copyRefusal.Store(&refuse)
	return func() { srv.copyRefusal.Store(nil) }
}
