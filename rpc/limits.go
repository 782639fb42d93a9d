package rpc

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"unicode"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/fsm"
)

// tooMany is a request naming more things than a limit allows:
// ResourceExhausted, like the state machine's size limits.
func tooMany(field, what string, n, limit int) error {
	return &fsm.ValidationError{Field: field, Rule: fmt.Sprintf("%d %s exceeds the limit of %d", n, what, limit), Kind: fsm.ErrTooLarge}
}

// checkAddNode checks AddNode's arguments before anything is proposed. The
// address becomes a voter's address in the meta group's Raft configuration,
// where a malformed one stays until the node is removed; the id becomes a
// Raft server id and a map entry. Errors are InvalidArgument.
func checkAddNode(req *taskstorepb.AddNodeRequest) error {
	switch {
	case req.Id == "":
		return invalid("id", "required")
	case len(req.Id) > fsm.DefaultLimits.MaxNameBytes:
		return invalid("id", "%d bytes exceeds the limit of %d", len(req.Id), fsm.DefaultLimits.MaxNameBytes)
	case strings.IndexFunc(req.Id, unicode.IsControl) >= 0 || strings.TrimSpace(req.Id) != req.Id:
		return invalid("id", "%q has control characters or surrounding space", req.Id)
	}
	if req.Address == "" {
		return nil // taken from the node's gossip
	}
	host, port, err := net.SplitHostPort(req.Address)
	if err != nil {
		return invalid("address", "%q is not host:port: %v", req.Address, err)
	}
	if host == "" || strings.IndexFunc(host, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return invalid("address", "%q: the host is empty or has spaces", req.Address)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return invalid("address", "%q: the port is not in 1..65535", req.Address)
	}
	return nil
}
