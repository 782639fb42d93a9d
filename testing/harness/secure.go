package harness

import (
	"crypto/tls"
	"encoding/base64"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/auth"
)

// Security is a secured test cluster's material: a CA and certificates in
// Dir, a token file, a gossip key, and the policy every node runs with.
type Security struct {
	Dir    string
	CA     *auth.CA
	Policy *auth.Policy
	// AdminToken and ClientToken are in the token file; ClientToken is
	// limited to queues under "demo/".
	AdminToken, ClientToken string
	GossipKey               []byte
}

// Files returns the TLS files of a certificate issued by IssueFor.
func (s *Security) Files(name string) auth.TLSFiles {
	return auth.TLSFiles{Cert: filepath.Join(s.Dir, name+".pem"), Key: filepath.Join(s.Dir, name+"-key.pem"), CA: filepath.Join(s.Dir, "ca.pem")}
}

// Issue makes a certificate of role named name, signed by the cluster CA,
// and returns its TLS files.
func (s *Security) Issue(t testing.TB, role, name string) auth.TLSFiles {
	t.Helper()
	is, err := s.CA.Issue(role, name, []string{"127.0.0.1", "localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := is.Save(s.Dir, name); err != nil {
		t.Fatal(err)
	}
	return s.Files(name)
}

// ClientTLS is a client configuration presenting name's certificate (or
// none for ""), trusting the cluster CA.
func (s *Security) ClientTLS(t testing.TB, name string) *tls.Config {
	t.Helper()
	f := auth.TLSFiles{CA: filepath.Join(s.Dir, "ca.pem")}
	if name != "" {
		f = s.Files(name)
	}
	c, err := f.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// NewSecurity makes a secured cluster's material for nodes ids, for
// process clusters (StartProcessesEach with NodeFlags); Start makes its own
// with Options.Secure.
func NewSecurity(t testing.TB, ids ...string) *Security {
	t.Helper()
	s := newSecurity(t, ids)
	files := map[string]string{
		"tokens":     s.AdminToken + " admin\n" + s.ClientToken + " client demo/ demo-client\n",
		"gossip.key": s.GossipKeyBase64() + "\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(s.Dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// NodeFlags are the taskstored flags of node id of a secured process
// cluster (NewSecurity): its certificate, the CA, the token file and the
// gossip key file.
func (s *Security) NodeFlags(id string) []string {
	f := s.Files(id)
	return []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", f.CA,
		"--auth-tokens", filepath.Join(s.Dir, "tokens"), "--gossip-key-file", filepath.Join(s.Dir, "gossip.key")}
}

// newSecurity makes the material for nodes ids.
func newSecurity(t testing.TB, ids []string) *Security {
	t.Helper()
	ca, err := auth.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s := &Security{Dir: t.TempDir(), CA: ca, AdminToken: "admin-token-0123456789", ClientToken: "client-token-0123456789",
		GossipKey: []byte("0123456789abcdef0123456789abcdef")}
	if err := ca.Save(s.Dir); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		s.Issue(t, auth.RoleNode, id)
	}
	s.Issue(t, auth.RoleAdmin, "admin")
	s.Issue(t, auth.RoleClient, "client")
	s.Issue(t, auth.RoleProxy, "proxy")
	tokens, err := auth.ParseTokens(s.AdminToken + " admin\n" + s.ClientToken + " client demo/ demo-client\n")
	if err != nil {
		t.Fatal(err)
	}
	s.Policy = &auth.Policy{Tokens: tokens, Required: true}
	return s
}

// nodeTLS returns a node's server and peer configurations.
func (s *Security) nodeTLS(t testing.TB, id string, clientAuth bool) (server, peer *tls.Config) {
	t.Helper()
	f := s.Files(id)
	f.ClientAuth = clientAuth
	server, err := f.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	if peer, err = f.PeerConfig(); err != nil {
		t.Fatal(err)
	}
	return server, peer
}

// GossipKeyBase64 is the gossip key as --gossip-key takes it.
func (s *Security) GossipKeyBase64() string { return base64.StdEncoding.EncodeToString(s.GossipKey) }
