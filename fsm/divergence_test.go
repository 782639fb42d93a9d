package fsm

import (
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// TestLogEntriesThisVersionCannotApplyPanic: a replica must stop rather than
// diverge on an entry it cannot decode or an op code from a newer version.
func TestLogEntriesThisVersionCannotApplyPanic(t *testing.T) {
	newer, err := proto.Marshal(&fsmpb.Command{Op: 42, Now: 1})
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"undecodable":   {0xff, 0xff, 0xff, 0xff},
		"unknown op 42": newer,
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("applied without panicking")
				}
			}()
			newMachine(t, Options{}).Apply(&raft.Log{Index: 1, Type: raft.LogCommand, Data: data})
		})
	}
}
