package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/e1158ecb/taskstore/testing/harness"
)

// TestNoCertificateSaysSo runs taskctl with the cluster's CA but no
// certificate against nodes that require one: the error says a client
// certificate is required and how to give one. It said "broken pipe ...
// the cluster did not answer in time: check --endpoints".
func TestNoCertificateSaysSo(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: 2, Secure: true, ClientAuth: true})
	c.WaitReady()
	r := runOffline(t, "--endpoints", c.Nodes[0].Addr, "--tls-ca", filepath.Join(c.Security.Dir, "ca.pem"), "--timeout", "3s", "status")
	if r.code == 0 {
		t.Fatalf("status without a certificate succeeded: %+v", r)
	}
	for _, want := range []string{"client certificate", "--tls-cert"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "check --endpoints") {
		t.Errorf("stderr blames the endpoints:\n%s", r.stderr)
	}
}
