package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/auth"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/client/clienttest"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func TestHelpTeaches(t *testing.T) {
	var out bytes.Buffer
	cmd := rootCmd(context.Background(), io.Discard)
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--help"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--cluster", "--listen", "--http", "/readyz", "Examples:", "taskproxy --listen 127.0.0.1:7000"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, out.String())
		}
	}
}

func TestClusterIsRequired(t *testing.T) {
	cmd := rootCmd(context.Background(), io.Discard)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	cmd.SetArgs([]string{"--listen", "127.0.0.1:0"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--cluster is required") {
		t.Fatalf("got %v", err)
	}
}

// TestServesUntilStopped runs taskproxy in front of a fake cluster: it
// becomes ready, serves gRPC and HTTP/JSON, and stops when its context ends
// (what SIGTERM does in main).
func TestServesUntilStopped(t *testing.T) {
	fc := clienttest.New(t, 3, 4)
	listen, httpAddr := freeAddr(t), freeAddr(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var logs bytes.Buffer
	cmd := rootCmd(ctx, &logs)
	cmd.SetArgs([]string{"--cluster", fc.Addrs(), "--listen", listen, "--http", httpAddr, "--log-level", "debug"})
	done := make(chan error, 1)
	go func() { done <- cmd.Execute() }()

	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := http.Get("http://" + httpAddr + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := client.Dial(cctx, listen, client.WithProxyOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Insert(cctx, "cmd/q", []byte("x"), client.WithID("t1")); err != nil {
		t.Fatal(err)
	}
	if fc.Task("t1") == nil {
		t.Fatal("the insert did not reach the cluster")
	}
	res, err := http.Get("http://" + httpAddr + "/v1/tasks?queue=cmd/q")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(body), `"id":"t1"`) {
		t.Fatalf("GET /v1/tasks: %d %s", res.StatusCode, body)
	}
	cc, err := grpc.NewClient(listen, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if r, err := healthpb.NewHealthClient(cc).Check(cctx, &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", r, err)
	}

	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("taskproxy returned %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("taskproxy did not stop")
	}
	if _, err := net.DialTimeout("tcp", listen, time.Second); err == nil {
		t.Error("still listening after stop")
	}
	if !strings.Contains(logs.String(), "routing table known") {
		t.Errorf("logs lack the ready line:\n%s", logs.String())
	}
}

// TestRefusesAnonymousCallersInFrontOfASecuredCluster:
// a proxy with a certificate for the cluster but no check of its own
// callers would hand its rights to anyone; it refuses to start unless told
// --allow-anonymous, and then says so loudly.
func TestRefusesAnonymousCallersInFrontOfASecuredCluster(t *testing.T) {
	dir := t.TempDir()
	ca, err := auth.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Save(dir); err != nil {
		t.Fatal(err)
	}
	is, err := ca.Issue(auth.RoleProxy, "proxy", []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := is.Save(dir, "proxy"); err != nil {
		t.Fatal(err)
	}
	cmd := rootCmd(context.Background(), io.Discard)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	cmd.SetArgs([]string{"--cluster", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--http", "",
		"--tls-cert", filepath.Join(dir, "proxy.pem"), "--tls-key", filepath.Join(dir, "proxy-key.pem"), "--tls-ca", filepath.Join(dir, "ca.pem")})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "checks none of its callers") || !strings.Contains(err.Error(), "--allow-anonymous") {
		t.Fatalf("a TLS proxy without caller checks: %v, want a refusal naming the flags", err)
	}

	for _, tc := range []struct {
		name                   string
		tlsOn, policyOn, allow bool
		wantErr, wantWarn      bool
	}{
		{name: "plaintext proxy, plaintext cluster"},
		{name: "checks callers", tlsOn: true, policyOn: true},
		{name: "anonymous", tlsOn: true, wantErr: true},
		{name: "anonymous, allowed", tlsOn: true, allow: true, wantWarn: true},
	} {
		var logs bytes.Buffer
		err := checkAnonymous(tc.tlsOn, tc.policyOn, tc.allow, slog.New(slog.NewTextHandler(&logs, nil)))
		if (err != nil) != tc.wantErr || strings.Contains(logs.String(), "level=WARN") != tc.wantWarn {
			t.Errorf("%s: err %v, logs %q", tc.name, err, logs.String())
		}
	}
}

// TestStreamIdleReachesTheProxysStreams: --stream-idle sets how long the
// proxy keeps an idle Produce stream to a node open. A streamed insert
// through the proxy opens one (taskstore_proxy_produce_streams 1), and with
// --stream-idle 300ms it is closed soon after (0), where the default would
// keep it for two minutes.
func TestStreamIdleReachesTheProxysStreams(t *testing.T) {
	fc := clienttest.New(t, 3, 4)
	listen, httpAddr := freeAddr(t), freeAddr(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	cmd := rootCmd(ctx, io.Discard)
	cmd.SetArgs([]string{"--cluster", fc.Addrs(), "--listen", listen, "--http", httpAddr, "--stream-idle", "300ms"})
	done := make(chan error, 1)
	go func() { done <- cmd.Execute() }()
	defer func() { stop(); <-done }()
	streams := func() string {
		res, err := http.Get("http://" + httpAddr + "/metrics")
		if err != nil {
			return ""
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		for _, line := range strings.Split(string(body), "\n") {
			if v, ok := strings.CutPrefix(line, "taskstore_proxy_produce_streams "); ok {
				return v
			}
		}
		return ""
	}
	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for streams() != want {
			if time.Now().After(deadline) {
				t.Fatalf("taskstore_proxy_produce_streams %q, want %q", streams(), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("0")
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := client.Dial(cctx, listen, client.WithProxyOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.ModifyStreamed(cctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Queue: "idle/q", Id: "a"}}}); err != nil {
		t.Fatal(err)
	}
	if got := streams(); got != "1" {
		t.Fatalf("taskstore_proxy_produce_streams %q after a streamed insert, want 1", got)
	}
	waitFor("0")
}

// TestStreamIdleHelp: --help says what --stream-idle does and its default.
func TestStreamIdleHelp(t *testing.T) {
	var out bytes.Buffer
	cmd := rootCmd(context.Background(), io.Discard)
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--help"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "--stream-idle duration") || !strings.Contains(out.String(), "(default 2m0s)") {
		t.Fatalf("--help lacks --stream-idle and its default:\n%s", out.String())
	}
}
