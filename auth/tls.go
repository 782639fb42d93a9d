package auth

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"

	"github.com/soheilhy/cmux"
)

// Roles a certificate's organizational unit or a token can carry.
const (
	RoleNode   = "node"
	RoleAdmin  = "admin"
	RoleClient = "client"
	RoleProxy  = "proxy"
)

// Roles lists every role, most privileged first.
var Roles = []string{RoleNode, RoleAdmin, RoleProxy, RoleClient}

// TLSFiles names the PEM files of one process's TLS setup: its certificate
// and key, and the cluster CA that verifies peers. The zero value means TLS
// is off.
type TLSFiles struct {
	Cert, Key, CA string
	// ClientAuth makes a server refuse connections without a client
	// certificate signed by CA. Without it a client certificate is still
	// verified when offered, and bearer tokens identify the others.
	ClientAuth bool
}

// Enabled reports whether any TLS file is set.
func (f TLSFiles) Enabled() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// Check reports a half-configured setup in terms of the command-line flags.
func (f TLSFiles) Check(server bool) error {
	if !f.Enabled() {
		if f.ClientAuth {
			return errors.New("--tls-client-auth needs --tls-cert, --tls-key and --tls-ca")
		}
		return nil
	}
	if (f.Cert == "") != (f.Key == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if server && f.Cert == "" {
		return errors.New("a server needs --tls-cert and --tls-key to serve TLS")
	}
	if server && f.CA == "" {
		return errors.New("a server needs --tls-ca to verify the cluster's certificates")
	}
	return nil
}

func (f TLSFiles) keyPair() (*tls.Certificate, error) {
	if f.Cert == "" {
		return nil, nil
	}
	kp, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, fmt.Errorf("load --tls-cert %s / --tls-key %s: %w", f.Cert, f.Key, err)
	}
	if kp.Leaf == nil {
		if kp.Leaf, err = x509.ParseCertificate(kp.Certificate[0]); err != nil {
			return nil, fmt.Errorf("parse --tls-cert %s: %w", f.Cert, err)
		}
	}
	return &kp, nil
}

func (f TLSFiles) pool() (*x509.CertPool, error) {
	if f.CA == "" {
		return nil, nil // the system roots
	}
	pem, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, fmt.Errorf("read --tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--tls-ca %s holds no PEM certificate", f.CA)
	}
	return pool, nil
}

// Role returns the role of the process's own certificate ("" without one).
func (f TLSFiles) Role() (string, error) {
	kp, err := f.keyPair()
	if err != nil || kp == nil {
		return "", err
	}
	return RoleOf(kp.Leaf), nil
}

// ServerConfig is the configuration of a TLS listener (node or proxy).
func (f TLSFiles) ServerConfig() (*tls.Config, error) {
	if err := f.Check(true); err != nil {
		return nil, err
	}
	kp, err := f.keyPair()
	if err != nil {
		return nil, err
	}
	pool, err := f.pool()
	if err != nil {
		return nil, err
	}
	c := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{*kp},
		ClientCAs:    pool,
		ClientAuth:   tls.VerifyClientCertIfGiven,
		NextProtos:   []string{"h2"},
	}
	if f.ClientAuth {
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return c, nil
}

// ClientConfig is the configuration of a connection to a node or proxy: the
// server's certificate must verify against CA (or the system roots) for the
// address dialled; the process's certificate, if any, is offered.
func (f TLSFiles) ClientConfig() (*tls.Config, error) {
	if err := f.Check(false); err != nil {
		return nil, err
	}
	kp, err := f.keyPair()
	if err != nil {
		return nil, err
	}
	pool, err := f.pool()
	if err != nil {
		return nil, err
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	if kp != nil {
		c.Certificates = []tls.Certificate{*kp}
	}
	return c, nil
}

// PeerConfig is the client side of a Raft connection to another node. Raft
// dials by address, and what matters is that the peer belongs to this
// cluster: its certificate must chain to CA and carry the node role. The
// host name is not checked.
func (f TLSFiles) PeerConfig() (*tls.Config, error) {
	c, err := f.ClientConfig()
	if err != nil {
		return nil, err
	}
	if len(c.Certificates) == 0 {
		return nil, errors.New("node-to-node TLS needs --tls-cert and --tls-key")
	}
	roots := c.RootCAs
	c.RootCAs = nil
	c.InsecureSkipVerify = true // replaced by VerifyConnection below
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		return VerifyNode(cs.PeerCertificates, roots)
	}
	return c, nil
}

// VerifyNode checks that a presented chain is signed by the cluster CA and
// names the node role.
func VerifyNode(chain []*x509.Certificate, roots *x509.CertPool) error {
	if len(chain) == 0 {
		return errors.New("peer presented no certificate")
	}
	opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}
	for _, c := range chain[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := chain[0].Verify(opts); err != nil {
		return fmt.Errorf("peer certificate %q is not from this cluster's CA: %w", chain[0].Subject.CommonName, err)
	}
	if role := RoleOf(chain[0]); role != RoleNode {
		return fmt.Errorf("peer certificate %q has role %q, want %q", chain[0].Subject.CommonName, role, RoleNode)
	}
	return nil
}

// RoleOf is the role a certificate names in its organizational unit; a
// certificate with none of the known roles is a client.
func RoleOf(c *x509.Certificate) string {
	if c == nil {
		return ""
	}
	for _, r := range Roles {
		if slices.Contains(c.Subject.OrganizationalUnit, r) {
			return r
		}
	}
	return RoleClient
}

// ConnState returns the TLS state of a connection accepted through a TLS
// listener, seeing through cmux's wrapper, or nil for a plain connection.
func ConnState(c net.Conn) *tls.ConnectionState {
	for {
		switch v := c.(type) {
		case *tls.Conn:
			cs := v.ConnectionState()
			return &cs
		case *cmux.MuxConn:
			c = v.Conn
		default:
			return nil
		}
	}
}
