package fsm

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// EncodeCommand serialises a command for raft.Apply.
func EncodeCommand(cmd *fsmpb.Command) ([]byte, error) {
	if cmd == nil {
		return nil, errors.New("fsm: encode: nil command")
	}
	return proto.Marshal(cmd)
}

// DecodeCommand parses a log entry's payload. It fails on bytes that are not
// a Command and on op codes this version does not know (a log written by a
// newer version), in the command or in a batch.
func DecodeCommand(data []byte) (*fsmpb.Command, error) {
	cmd := &fsmpb.Command{}
	if err := proto.Unmarshal(data, cmd); err != nil {
		return nil, fmt.Errorf("fsm: decode command: %w", err)
	}
	if err := checkOps(cmd, ""); err != nil {
		return nil, fmt.Errorf("fsm: decode command: %w", err)
	}
	return cmd, nil
}

func checkOps(cmd *fsmpb.Command, path string) error {
	if cmd.Op <= fsmpb.Op_OP_UNSPECIFIED || cmd.Op > fsmpb.Op_OP_EXPIRE {
		return fmt.Errorf("%sop: %d is unknown to this version", path, int32(cmd.Op))
	}
	if cmd.Op == fsmpb.Op_OP_SET_FORMAT && cmd.Format > MaxFormat {
		return fmt.Errorf("%sformat: state format %d is newer than this version's %d", path, cmd.Format, MaxFormat)
	}
	for i, sub := range cmd.Batch {
		if err := checkOps(sub, fmt.Sprintf("%sbatch[%d].", path, i)); err != nil {
			return err
		}
	}
	return nil
}
