package cluster

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/e1158ecb/taskstore/fsm"
)

// markerStore keeps the snapshots of a data shard whose state is on disk.
// raft's own snapshots are markers (fsm/marker.go): a few bytes saying the
// engine flushed everything up to an index, instead of a copy of the whole
// state every SnapshotThreshold entries. When raft opens a marker to send
// it to a follower, the store writes the state's stream from the engine
// into a temporary file first (raft needs the size before it sends) and
// hands that out; the file goes when raft closes it.
//
// raft opens the latest snapshot when the group starts, too, to restore it;
// that is before started is set, and gets the marker itself, which the
// machine restores by keeping its engine. Everything else it opens (a
// snapshot a follower received, to install) is a full stream, passed on.
type markerStore struct {
	*raft.FileSnapshotStore
	dir     string
	machine *fsm.Machine
	started atomic.Bool
}

func (s *markerStore) Open(id string) (*raft.SnapshotMeta, io.ReadCloser, error) {
	meta, rc, err := s.FileSnapshotStore.Open(id)
	if err != nil || !s.started.Load() {
		return meta, rc, err
	}
	br := bufio.NewReader(rc)
	if !fsm.IsMarker(br) {
		return meta, struct {
			io.Reader
			io.Closer
		}{br, rc}, nil
	}
	rc.Close()
	f, size, err := s.expand()
	if err != nil {
		return nil, nil, fmt.Errorf("snapshot %s: the state's stream for a follower: %w", id, err)
	}
	m := *meta
	m.Size = size
	return &m, &tempFile{f}, nil
}

// expand writes the state's full stream to a temporary file, rewound.
func (s *markerStore) expand() (*os.File, int64, error) {
	f, err := os.CreateTemp(s.dir, "expanded-*.tmp")
	if err != nil {
		return nil, 0, err
	}
	fail := func(err error) (*os.File, int64, error) {
		f.Close()
		os.Remove(f.Name())
		return nil, 0, err
	}
	snap, err := s.machine.FullSnapshot()
	if err != nil {
		return fail(err)
	}
	err = snap.Persist(fileSink{f})
	snap.Release()
	if err != nil {
		return fail(err)
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return fail(err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fail(err)
	}
	return f, size, nil
}

// fileSink is a raft.SnapshotSink writing to a file the caller closes.
type fileSink struct{ *os.File }

func (fileSink) ID() string    { return "expanded" }
func (fileSink) Cancel() error { return nil }
func (fileSink) Close() error  { return nil }

// tempFile is an expanded stream: closing it deletes it.
type tempFile struct{ *os.File }

func (t *tempFile) Close() error {
	err := t.File.Close()
	if rerr := os.Remove(t.Name()); err == nil {
		err = rerr
	}
	return err
}
