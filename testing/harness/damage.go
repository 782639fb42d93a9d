package harness

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
)

// FlipNodeLogEntry flips a byte in the data of an entry of group (a shard
// id) in the middle of a stopped node's shared Raft log
// (<dataDir>/raftlog/*.wal), where good records follow it, and says which.
// Records are [crc u32][len u32][kind u8][group u32][index u64]..., kind 1
// an entry (cluster/nodelog).
func FlipNodeLogEntry(dataDir string, group uint32) (string, error) {
	segs, err := filepath.Glob(filepath.Join(dataDir, "raftlog", "*.wal"))
	if err != nil || len(segs) == 0 {
		return "", fmt.Errorf("no node log segments in %s: %v", dataDir, err)
	}
	type rec struct {
		path string
		end  int
	}
	var entries []rec
	for _, path := range segs {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", err
		}
		for o := 0; o+8 <= len(b); {
			n := int(binary.BigEndian.Uint32(b[o+4:]))
			if n == 0 || o+8+n > len(b) {
				break
			}
			body := b[o+8 : o+8+n]
			if body[0] == 1 && binary.BigEndian.Uint32(body[1:]) == group {
				entries = append(entries, rec{path, o + 8 + n})
			}
			o += 8 + n
		}
	}
	if len(entries) < 3 {
		return "", fmt.Errorf("%d entries of group %d in the node log", len(entries), group)
	}
	victim := entries[len(entries)/2]
	b, err := os.ReadFile(victim.path)
	if err != nil {
		return "", err
	}
	b[victim.end-1] ^= 0x40 // the entry's last byte (its extensions' length or data)
	if err := os.WriteFile(victim.path, b, 0o644); err != nil {
		return "", err
	}
	return fmt.Sprintf("entry %d of %d of group %d in %s", len(entries)/2+1, len(entries), group, victim.path), nil
}
