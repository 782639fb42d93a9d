package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/e1158ecb/taskstore/auth"
	"github.com/e1158ecb/taskstore/cmd/internal/secflags"
)

func runOffline(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := execute(context.Background(), args, &out, &errb, func(string) string { return "" })
	return result{out.String(), errb.String(), code}
}

// TestCertLocalMakesAWorkingSet: 'cert local' writes certificates whose roles
// and chains are right, a usable gossip key and token file, and never
// replaces a file.
func TestCertLocalMakesAWorkingSet(t *testing.T) {
	dir := t.TempDir()
	if r := runOffline(t, "cert", "local", "--dir", dir, "--nodes", "a,b"); r.code != 0 {
		t.Fatalf("cert local: %+v", r)
	}
	for name, role := range map[string]string{"a": auth.RoleNode, "b": auth.RoleNode, "admin": auth.RoleAdmin, "proxy": auth.RoleProxy, "client": auth.RoleClient} {
		f := auth.TLSFiles{Cert: filepath.Join(dir, name+".pem"), Key: filepath.Join(dir, name+"-key.pem"), CA: filepath.Join(dir, "ca.pem")}
		if got, err := f.Role(); err != nil || got != role {
			t.Errorf("%s: role %q %v, want %q", name, got, err, role)
		}
		if _, err := f.ServerConfig(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	key, err := os.ReadFile(filepath.Join(dir, "gossip.key"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := secflags.ParseGossipKeys([]string{strings.TrimSpace(string(key))}); err != nil {
		t.Errorf("gossip.key: %v", err)
	}
	tokens, err := auth.LoadTokens(filepath.Join(dir, "tokens"))
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := os.ReadFile(filepath.Join(dir, "client.token"))
	if p, ok := tokens.Lookup(strings.TrimSpace(string(tok))); !ok || p.Role != auth.RoleClient || !p.AllowsQueue("demo/x") || p.AllowsQueue("other/x") {
		t.Errorf("client token: %+v %v", p, ok)
	}
	if r := runOffline(t, "cert", "local", "--dir", dir); r.code == 0 || !strings.Contains(r.stderr, "not replacing") {
		t.Errorf("second cert local: %+v, want a refusal to replace files", r)
	}
	if r := runOffline(t, "cert", "issue", "admin", "bob", "--dir", dir); r.code != 0 {
		t.Fatalf("cert issue: %+v", r)
	}
	if r := runOffline(t, "cert", "issue", "root", "eve", "--dir", dir); r.code == 0 || !strings.Contains(r.stderr, "unknown role") {
		t.Errorf("cert issue with a bad role: %+v", r)
	}
	if r := runOffline(t, "cert", "issue", "admin", "x", "--dir", t.TempDir()); r.code == 0 || !strings.Contains(r.stderr, "cert ca") {
		t.Errorf("cert issue without a CA: %+v", r)
	}
}
