package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/auth"
	"github.com/e1158ecb/taskstore/client"
)

// tlsServer serves TLS on a real socket with the cluster's server
// configuration and answers nothing: it only completes handshakes.
func tlsServer(t *testing.T, clientAuth bool) (addr string, files auth.TLSFiles) {
	t.Helper()
	dir := t.TempDir()
	ca, err := auth.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Save(dir); err != nil {
		t.Fatal(err)
	}
	node, err := ca.Issue(auth.RoleNode, "n1", []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Save(dir, "n1"); err != nil {
		t.Fatal(err)
	}
	srv := auth.TLSFiles{Cert: filepath.Join(dir, "n1.pem"), Key: filepath.Join(dir, "n1-key.pem"), CA: filepath.Join(dir, "ca.pem"), ClientAuth: clientAuth}
	cfg, err := srv.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if c.(*tls.Conn).Handshake() != nil {
					return
				}
				c.Read(make([]byte, 1)) // hold the connection open
			}()
		}
	}()
	return ln.Addr().String(), auth.TLSFiles{CA: srv.CA}
}

// TestProbeFindsCertificateRequired: a server that requires a client
// certificate is diagnosed from its alert, whatever the gRPC call saw
// (a "broken pipe" from the TLS 1.3 race in CI).
func TestProbeFindsCertificateRequired(t *testing.T) {
	addr, files := tlsServer(t, true)
	cfg, err := files.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	got, err := probeTLS(context.Background(), "  ,"+addr, cfg, 2*time.Second)
	if err == nil || !strings.Contains(err.Error(), "certificate required") {
		t.Fatalf("probe = %q, %v; want a certificate-required refusal", got, err)
	}
	if got != addr {
		t.Errorf("probe blamed %q, want %q", got, addr)
	}

	var out bytes.Buffer
	call := errors.Join(client.ErrUnavailable, context.DeadlineExceeded, errors.New("write: broken pipe"))
	printError(&out, &tlsRefusedError{addr: got, cause: err, call: call})
	for _, want := range []string{"certificate required", "--tls-cert", "broken pipe"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("printed error lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "check --endpoints") {
		t.Errorf("printed error blames the endpoints:\n%s", out.String())
	}
}

// TestProbeQuietWhenAccepted: a server that accepts the connection (client
// certificates optional) and one that is not there give no diagnosis, so
// the call's own error stands.
func TestProbeQuietWhenAccepted(t *testing.T) {
	addr, files := tlsServer(t, false)
	cfg, err := files.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := probeTLS(context.Background(), addr, cfg, 300*time.Millisecond); err != nil {
		t.Errorf("probe of an accepting server = %q, %v; want no refusal", got, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := ln.Addr().String()
	ln.Close()
	if got, err := probeTLS(context.Background(), gone, cfg, 300*time.Millisecond); err != nil {
		t.Errorf("probe of a closed port = %q, %v; want no refusal", got, err)
	}
}
