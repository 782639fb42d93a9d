package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// CA is a certificate authority that issues a cluster's certificates.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// NewCA makes a self-signed CA valid for validity.
func NewCA(name string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"taskstore"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// Issued is a certificate and its key, PEM-encoded.
type Issued struct {
	CertPEM, KeyPEM []byte
}

// Issue signs a certificate for role (the organizational unit) and name
// (the common name), usable as server and client certificate. hosts become
// DNS or IP subject alternative names: what clients dial must be among them.
func (ca *CA) Issue(role, name string, hosts []string, validity time.Duration) (*Issued, error) {
	if !slices.Contains(Roles, role) {
		return nil, fmt.Errorf("unknown role %q (want one of %v)", role, Roles)
	}
	if name == "" {
		return nil, errors.New("a certificate needs a name")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name, Organization: []string{"taskstore"}, OrganizationalUnit: []string{role}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return &Issued{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	}, nil
}

// Save writes the CA as dir/ca.pem and dir/ca-key.pem, refusing to replace
// existing files.
func (ca *CA) Save(dir string) error {
	kder, err := x509.MarshalECPrivateKey(ca.Key)
	if err != nil {
		return err
	}
	return writeNew(dir, "ca",
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))
}

// Save writes the certificate as dir/name.pem and its key as
// dir/name-key.pem (mode 0600), refusing to replace existing files.
func (is *Issued) Save(dir, name string) error {
	return writeNew(dir, name, is.CertPEM, is.KeyPEM)
}

func writeNew(dir, name string, cert, key []byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cp, kp := filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	for _, p := range []string{cp, kp} {
		if _, err := os.Stat(p); err == nil {
			return fmt.Errorf("%s exists; not replacing it", p)
		}
	}
	if err := os.WriteFile(kp, key, 0o600); err != nil {
		return err
	}
	return os.WriteFile(cp, cert, 0o644)
}

// LoadCA reads dir/ca.pem and dir/ca-key.pem.
func LoadCA(dir string) (*CA, error) {
	cp, err := os.ReadFile(filepath.Join(dir, "ca.pem"))
	if err != nil {
		return nil, fmt.Errorf("read CA: %w (make one with 'taskctl cert ca --dir %s')", err, dir)
	}
	kp, err := os.ReadFile(filepath.Join(dir, "ca-key.pem"))
	if err != nil {
		return nil, fmt.Errorf("read CA key: %w", err)
	}
	cb, _ := pem.Decode(cp)
	kb, _ := pem.Decode(kp)
	if cb == nil || kb == nil {
		return nil, fmt.Errorf("%s: ca.pem or ca-key.pem is not PEM", dir)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse CA: %w", err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse CA key: %w", err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("%s/ca.pem is not a CA certificate", dir)
	}
	return &CA{Cert: cert, Key: key}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}
