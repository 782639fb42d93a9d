// Package secflags holds the security flags that taskstored, taskproxy and
// taskctl share, and turns them into TLS configurations, an authorization
// policy and gossip keys (see docs/security.md).
package secflags

import (
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/e1158ecb/taskstore/api/limits"
	"github.com/e1158ecb/taskstore/auth"
	"github.com/e1158ecb/taskstore/client"
)

// GossipKeyEnv holds a node's gossip key when neither --gossip-key nor
// --gossip-key-file is given (environment, not the process list).
const GossipKeyEnv = "TASKSTORE_GOSSIP_KEY"

// Server is the security of a serving process (node or proxy).
type Server struct {
	TLS       auth.TLSFiles
	TokenFile string
	// Gossip (nodes only).
	GossipKey, GossipKeyFile, ClusterName string
	// RateLimit and RateBurst bound each client's calls (limits.Server).
	RateLimit float64
	RateBurst int
}

// Limits are the limits.Server the flags ask for: the shared message sizes and
// stream bound, and the rate limit if one was set.
func (s *Server) Limits() limits.Server {
	return limits.Server{RatePerClient: s.RateLimit, Burst: s.RateBurst}
}

// Register adds the flags; node adds the gossip ones.
func (s *Server) Register(fl *pflag.FlagSet, node bool) {
	registerTLS(fl, &s.TLS)
	fl.BoolVar(&s.TLS.ClientAuth, "tls-client-auth", false, "refuse connections without a client certificate from --tls-ca")
	fl.Float64Var(&s.RateLimit, "rate-limit", 0, "calls per second allowed to each client (by certificate name, else IP); over it answers ResourceExhausted; 0: no limit")
	fl.IntVar(&s.RateBurst, "rate-burst", 0, "calls a client may make at once after being idle (default: one second of --rate-limit)")
	fl.StringVar(&s.TokenFile, "auth-tokens", "", "file of bearer tokens, one 'TOKEN ROLE [QUEUE-PREFIXES] [NAME]' per line; turns authorization on (needs TLS)")
	if node {
		fl.StringVar(&s.GossipKey, "gossip-key", "", "base64 key (16, 24 or 32 bytes) that encrypts gossip; the same on every node. Prefer --gossip-key-file or $"+GossipKeyEnv+": a flag is visible to every local user in the process list")
		fl.StringVar(&s.GossipKeyFile, "gossip-key-file", "", "file of base64 gossip keys, one per line: the first encrypts, all decrypt (key rotation)")
		fl.StringVar(&s.ClusterName, "cluster-name", "taskstore", "label on every gossip packet: nodes of differently named clusters ignore each other")
	}
}

func registerTLS(fl *pflag.FlagSet, f *auth.TLSFiles) {
	fl.StringVar(&f.Cert, "tls-cert", "", "PEM certificate of this process (turns TLS on; 'taskctl cert' makes one)")
	fl.StringVar(&f.Key, "tls-key", "", "PEM private key of --tls-cert")
	fl.StringVar(&f.CA, "tls-ca", "", "PEM CA certificate that signs the cluster's certificates")
}

// Security is what a server runs with.
type Security struct {
	ServerTLS, PeerTLS *tls.Config // nil without TLS
	Policy             *auth.Policy
	GossipKeys         [][]byte
}

// Load reads the files the flags name. node asks for the peer (Raft) side
// too, which needs the node role in the certificate.
func (s *Server) Load(log *slog.Logger, node bool) (Security, error) {
	var sec Security
	if err := s.TLS.Check(true); err != nil {
		return sec, err
	}
	pol := &auth.Policy{Required: s.TLS.ClientAuth, Log: log.With("component", "auth")}
	if s.TokenFile != "" {
		if !s.TLS.Enabled() {
			return sec, errors.New("--auth-tokens needs TLS (--tls-cert, --tls-key, --tls-ca): tokens must not cross the network in the clear")
		}
		t, err := auth.LoadTokens(s.TokenFile)
		if err != nil {
			return sec, err
		}
		pol.Tokens, pol.Required = t, true
	}
	sec.Policy = pol
	if s.TLS.Enabled() {
		var err error
		if sec.ServerTLS, err = s.TLS.ServerConfig(); err != nil {
			return sec, err
		}
		if node {
			role, err := s.TLS.Role()
			if err != nil {
				return sec, err
			}
			if role != auth.RoleNode {
				return sec, fmt.Errorf("--tls-cert has role %q; a node's certificate needs role node (organizational unit \"node\"; 'taskctl cert node')", role)
			}
			if sec.PeerTLS, err = s.TLS.PeerConfig(); err != nil {
				return sec, err
			}
		}
	} else if node {
		log.Warn("TLS is off: clients, proxies and other nodes connect in the clear and unauthenticated (see docs/security.md)")
	}
	if node {
		if s.GossipKey != "" {
			log.Warn("--gossip-key puts the key on the command line, where every local user can read it (ps, /proc/PID/cmdline): use --gossip-key-file or $" + GossipKeyEnv)
		} else if k := os.Getenv(GossipKeyEnv); k != "" && s.GossipKeyFile == "" {
			s.GossipKey = k
		}
		keys, err := s.gossipKeys()
		if err != nil {
			return sec, err
		}
		sec.GossipKeys = keys
		if len(keys) == 0 && s.TLS.Enabled() {
			log.Warn("gossip is not encrypted: set --gossip-key or --gossip-key-file")
		}
	}
	return sec, nil
}

func (s *Server) gossipKeys() ([][]byte, error) {
	if s.GossipKey != "" && s.GossipKeyFile != "" {
		return nil, errors.New("--gossip-key and --gossip-key-file: give one")
	}
	var lines []string
	if s.GossipKey != "" {
		lines = []string{s.GossipKey}
	}
	if s.GossipKeyFile != "" {
		data, err := os.ReadFile(s.GossipKeyFile)
		if err != nil {
			return nil, fmt.Errorf("--gossip-key-file: %w", err)
		}
		for _, l := range strings.Split(string(data), "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				lines = append(lines, l)
			}
		}
		if len(lines) == 0 {
			return nil, fmt.Errorf("--gossip-key-file %s holds no key", s.GossipKeyFile)
		}
	}
	return ParseGossipKeys(lines)
}

// ParseGossipKeys decodes base64 gossip keys and checks their lengths.
func ParseGossipKeys(lines []string) ([][]byte, error) {
	var keys [][]byte
	for i, l := range lines {
		k, err := base64.StdEncoding.DecodeString(l)
		if err != nil {
			return nil, fmt.Errorf("gossip key %d: not base64: %w", i+1, err)
		}
		if n := len(k); n != 16 && n != 24 && n != 32 {
			return nil, fmt.Errorf("gossip key %d: %d bytes, want 16, 24 or 32 ('taskctl cert gossip-key' makes one)", i+1, n)
		}
		for _, o := range keys {
			if bytes.Equal(o, k) {
				return nil, fmt.Errorf("gossip key %d: listed twice", i+1)
			}
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// Client is the security of a client process (taskctl, taskbench).
type Client struct {
	TLS       auth.TLSFiles
	TokenFile string
}

// Register adds the client flags.
func (c *Client) Register(fl *pflag.FlagSet) {
	registerTLS(fl, &c.TLS)
	fl.StringVar(&c.TokenFile, "token-file", "", "file holding a bearer token to send (needs TLS)")
}

// Options returns the client options the flags ask for.
func (c *Client) Options() ([]client.Option, error) {
	if !c.TLS.Enabled() {
		if c.TokenFile != "" {
			return nil, errors.New("--token-file needs TLS (--tls-ca, and --tls-cert/--tls-key for a client certificate)")
		}
		return nil, nil
	}
	cfg, err := c.TLS.ClientConfig()
	if err != nil {
		return nil, err
	}
	opts := []client.Option{client.WithTLS(cfg)}
	if c.TokenFile != "" {
		data, err := os.ReadFile(c.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		tok := strings.TrimSpace(string(data))
		if tok == "" {
			return nil, fmt.Errorf("--token-file %s is empty", c.TokenFile)
		}
		opts = append(opts, client.WithBearerToken(tok))
	}
	return opts, nil
}
