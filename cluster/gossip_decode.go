package cluster

import (
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"unicode"

	"github.com/hashicorp/memberlist"
)

// decodeGossipMeta decodes the metadata a member gossips (gossipMeta, as
// JSON). Gossip is authenticated by the cluster's gossip key at most, and
// what it carries ends up in the cluster map: the meta leader records the
// addresses (metaChores.record) and AddNode without an address uses the gossiped
// one as a Raft voter's address. So metadata that is over memberlist's size
// limit or not JSON decodes to the zero gossipMeta, and an address that is
// not host:port is dropped; the member still counts for health.
func decodeGossipMeta(b []byte) gossipMeta {
	var m gossipMeta
	if len(b) == 0 || len(b) > memberlist.MetaMaxSize || json.Unmarshal(b, &m) != nil {
		return gossipMeta{}
	}
	if !validGossipAddr(m.Address) {
		m.Address = ""
	}
	if !validGossipAddr(m.HTTPAddress) {
		m.HTTPAddress = ""
	}
	return m
}

// validGossipAddr: host:port with a port in 1..65535 and a host without
// spaces or control characters (empty for HTTP's "all interfaces").
func validGossipAddr(s string) bool {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return false
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return false
	}
	return strings.IndexFunc(host, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) < 0
}
