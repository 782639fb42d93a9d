package security_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/auth"
	"github.com/e1158ecb/taskstore/client"
	"github.com/e1158ecb/taskstore/cluster/peerpb"
	"github.com/e1158ecb/taskstore/proxy"
	"github.com/e1158ecb/taskstore/testing/harness"
)

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// call is one kind of call; admin ones need the admin role.
type call struct {
	name  string
	admin bool
	do    func(ctx context.Context, cc *grpc.ClientConn) error
}

// calls covers every TaskStore and Admin method. Task calls name queue.
func calls(queue string) []call {
	ts := func(cc *grpc.ClientConn) taskstorepb.TaskStoreClient { return taskstorepb.NewTaskStoreClient(cc) }
	ad := func(cc *grpc.ClientConn) taskstorepb.AdminClient { return taskstorepb.NewAdminClient(cc) }
	return []call{
		{"Modify", false, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := ts(cc).Modify(ctx, &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{{Queue: queue, Value: []byte("x")}}})
			return err
		}},
		{"Claim", false, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := ts(cc).Claim(ctx, &taskstorepb.ClaimRequest{Claimant: "c", Queues: []string{queue}})
			return err
		}},
		{"Tasks", false, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := ts(cc).Tasks(ctx, &taskstorepb.TasksRequest{Queue: queue})
			return err
		}},
		{"Queues", false, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := ts(cc).Queues(ctx, &taskstorepb.QueuesRequest{Prefix: queue})
			return err
		}},
		{"Time", false, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := ts(cc).Time(ctx, &taskstorepb.TimeRequest{})
			return err
		}},
		{"Status", false, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := ad(cc).Status(ctx, &taskstorepb.StatusRequest{})
			return err
		}},
		{"Routing", false, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := ad(cc).Routing(ctx, &taskstorepb.RoutingRequest{})
			return err
		}},
		{"Purge", true, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := ts(cc).Purge(ctx, &taskstorepb.PurgeRequest{Queue: queue})
			return err
		}},
		{"TransferLeader", true, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := ad(cc).TransferLeader(ctx, &taskstorepb.TransferLeaderRequest{Shard: 1})
			return err
		}},
		{"AddNode", true, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := ad(cc).AddNode(ctx, &taskstorepb.AddNodeRequest{Id: "n9", Address: "127.0.0.1:1"})
			return err
		}},
		{"RemoveNode", true, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := ad(cc).RemoveNode(ctx, &taskstorepb.RemoveNodeRequest{Id: "n3"})
			return err
		}},
		// A backup holds every task's value: a refused caller gets no
		// byte of it (the refusal is the stream's first answer).
		{"Backup", true, func(ctx context.Context, cc *grpc.ClientConn) error {
			stream, err := ad(cc).Backup(ctx, &taskstorepb.BackupRequest{Shard: 1})
			if err != nil {
				return err
			}
			_, err = stream.Recv()
			return err
		}},
		// The follower path: the leader's redirect, and the copy a
		// replica streams to a caller that followed one.
		{"Backup redirect", true, func(ctx context.Context, cc *grpc.ClientConn) error {
			stream, err := ad(cc).Backup(ctx, &taskstorepb.BackupRequest{Shard: 1, Follow: true})
			if err != nil {
				return err
			}
			_, err = stream.Recv()
			return err
		}},
		{"Backup from a replica", true, func(ctx context.Context, cc *grpc.ClientConn) error {
			stream, err := ad(cc).Backup(ctx, &taskstorepb.BackupRequest{Shard: 1, MinIndex: 1, Follow: true})
			if err != nil {
				return err
			}
			_, err = stream.Recv()
			return err
		}},
	}
}

// dial connects to addr with cfg and, if token is set, a bearer token.
func dial(t *testing.T, addr string, cfg *tls.Config, token string) *grpc.ClientConn {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(cfg))}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(client.BearerToken(token)))
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// foreignCert makes a certificate of role from a CA the cluster does not
// know, trusting the cluster's CA for the server side.
func foreignCert(t *testing.T, sec *harness.Security, role string) *tls.Config {
	t.Helper()
	ca, err := auth.NewCA("foreign", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	is, err := ca.Issue(role, "intruder-"+role, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := is.Save(dir, "intruder"); err != nil {
		t.Fatal(err)
	}
	f := auth.TLSFiles{Cert: filepath.Join(dir, "intruder.pem"), Key: filepath.Join(dir, "intruder-key.pem"), CA: filepath.Join(sec.Dir, "ca.pem")}
	cfg, err := f.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	// Present it even though the server asks for certificates of its own
	// CA (Go's client would otherwise quietly send none).
	cert := cfg.Certificates[0]
	cfg.Certificates = nil
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	return cfg
}

// TestSecuredClusterRefusesWhoItShould: each kind of call, from each kind of
// wrong caller, is refused with the right code; the rightful callers work;
// nothing a refused call carried was written.
func TestSecuredClusterRefusesWhoItShould(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: 2, Secure: true})
	c.WaitReady()
	sec := c.Security
	addr := c.Nodes[0].Addr

	type caller struct {
		name string
		cc   *grpc.ClientConn
		// want returns the code the caller must get for a call (OK: not
		// refused by the policy).
		want func(cl call) codes.Code
		// handshake: refused before any call, at the TLS handshake.
		handshake bool
	}
	spoof := metadata.AppendToOutgoingContext // a client claiming to speak for an admin
	callers := []caller{
		{name: "no certificate, no token", cc: dial(t, addr, sec.ClientTLS(t, ""), ""),
			want: func(call) codes.Code { return codes.Unauthenticated }},
		{name: "unknown token", cc: dial(t, addr, sec.ClientTLS(t, ""), "not-a-token-of-this-cluster"),
			want: func(call) codes.Code { return codes.Unauthenticated }},
		{name: "certificate from another CA", cc: dial(t, addr, foreignCert(t, sec, auth.RoleAdmin), ""), handshake: true},
		{name: "client certificate", cc: dial(t, addr, sec.ClientTLS(t, "client"), ""),
			want: func(cl call) codes.Code {
				if cl.admin {
					return codes.PermissionDenied
				}
				return codes.OK
			}},
		{name: "client token limited to demo/", cc: dial(t, addr, sec.ClientTLS(t, ""), sec.ClientToken),
			want: func(cl call) codes.Code {
				if cl.admin || cl.name == "Modify" || cl.name == "Claim" || cl.name == "Tasks" || cl.name == "Queues" {
					return codes.PermissionDenied // other/ is not under demo/
				}
				return codes.OK
			}},
	}
	for _, cr := range callers {
		t.Run(strings.ReplaceAll(cr.name, " ", "_"), func(t *testing.T) {
			for _, cl := range calls("other/q") {
				ctx := ctxT(t, 10*time.Second)
				err := cl.do(ctx, cr.cc)
				got := status.Code(err)
				if cr.handshake {
					// TLS 1.3 reports the server's refusal at the client's
					// first write or read: "bad certificate", "broken pipe".
					if got != codes.Unavailable {
						t.Errorf("%s: %v, want Unavailable from a refused TLS handshake", cl.name, err)
					}
					continue
				}
				want := cr.want(cl)
				if want == codes.OK {
					if got == codes.Unauthenticated || got == codes.PermissionDenied {
						t.Errorf("%s: refused: %v", cl.name, err)
					}
					continue
				}
				if got != want {
					t.Errorf("%s: %v, want %v", cl.name, err, want)
				}
			}
		})
	}
	t.Run("client_certificate_speaking_for_an_admin", func(t *testing.T) {
		cc := dial(t, addr, sec.ClientTLS(t, "client"), "")
		ctx := spoof(ctxT(t, 10*time.Second), auth.PrincipalHeader, "role=admin&name=mallory")
		_, err := taskstorepb.NewAdminClient(cc).RemoveNode(ctx, &taskstorepb.RemoveNodeRequest{Id: "n3"})
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("spoofed principal header: %v, want PermissionDenied", err)
		}
	})

	t.Run("proxy_certificate_speaking_for_a_node", func(t *testing.T) {
		// A proxy may speak for its callers, but never as a node: that
		// would reach the nodes' internal service, the wipe of a replica
		// among it. An admin may read Peer.Report (to debug), not wipe.
		proxyConn := dial(t, addr, sec.ClientTLS(t, "proxy"), "")
		ctx := spoof(ctxT(t, 10*time.Second), auth.PrincipalHeader, "role=node&name=n9")
		if _, err := peerpb.NewPeerClient(proxyConn).WipeReplica(ctx, &peerpb.WipeReplicaRequest{Shard: 1, Node: "n1"}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("proxy speaking for a node, WipeReplica: %v, want PermissionDenied", err)
		}
		if _, err := peerpb.NewPeerClient(proxyConn).Report(ctx, &peerpb.ReportRequest{}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("proxy speaking for a node, Report: %v, want PermissionDenied", err)
		}
		adminConn := dial(t, addr, sec.ClientTLS(t, "admin"), "")
		actx := ctxT(t, 10*time.Second)
		if _, err := peerpb.NewPeerClient(adminConn).Report(actx, &peerpb.ReportRequest{}); err != nil {
			t.Errorf("admin, Report: %v", err)
		}
		if _, err := peerpb.NewPeerClient(adminConn).WipeReplica(actx, &peerpb.WipeReplicaRequest{Shard: 1, Node: "n1"}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("admin, WipeReplica: %v, want PermissionDenied", err)
		}
	})

	// The rightful callers: a client certificate works a task through
	// demo/, the restricted token too, and the admin purges.
	ctx := ctxT(t, 30*time.Second)
	worker, err := client.Dial(ctx, strings.Join(c.Endpoints(), ","), client.WithTLS(sec.ClientTLS(t, "client")))
	if err != nil {
		t.Fatal(err)
	}
	defer worker.Close()
	if _, err := worker.Insert(ctx, "demo/jobs", []byte("a")); err != nil {
		t.Fatalf("client certificate insert: %v", err)
	}
	tokenClient, err := client.Dial(ctx, strings.Join(c.Endpoints(), ","), client.WithTLS(sec.ClientTLS(t, "")), client.WithBearerToken(sec.ClientToken))
	if err != nil {
		t.Fatal(err)
	}
	defer tokenClient.Close()
	if _, err := tokenClient.Insert(ctx, "demo/jobs", []byte("b")); err != nil {
		t.Fatalf("token insert under demo/: %v", err)
	}
	res, err := tokenClient.Claim(ctx, &taskstorepb.ClaimRequest{Queues: []string{"demo/jobs"}, Limit: 2})
	if err != nil || len(res.Tasks) != 2 {
		t.Fatalf("token claim: %v %v", res, err)
	}
	if _, err := tokenClient.Insert(ctx, "other/jobs", []byte("c")); !errors.Is(err, client.ErrPermission) {
		t.Fatalf("token insert outside demo/: %v, want ErrPermission", err)
	}
	if _, err := worker.Purge(ctx, "demo/jobs"); !errors.Is(err, client.ErrPermission) {
		t.Fatalf("client purge: %v, want ErrPermission", err)
	}
	admin, err := client.Dial(ctx, strings.Join(c.Endpoints(), ","), client.WithTLS(sec.ClientTLS(t, "admin")))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	// Nothing the refused calls carried reached the store.
	for _, q := range []string{"other/q", "other/jobs"} {
		got, err := admin.Tasks(ctx, &taskstorepb.TasksRequest{Queue: q})
		if err != nil || len(got.Tasks) != 0 {
			t.Fatalf("%s after refusals: %v %v, want empty", q, got, err)
		}
	}
	if n, err := admin.Purge(ctx, "demo/jobs"); err != nil || n != 2 {
		t.Fatalf("admin purge: %d %v, want 2 deleted", n, err)
	}
	if _, err := admin.TransferLeader(ctx, &taskstorepb.TransferLeaderRequest{Shard: 1}); err != nil {
		t.Fatalf("admin transfer: %v", err)
	}
}

// raftMagic opens a Raft connection on a node's shared port
// (cluster/transport.go).
const raftMagic = "TSRAFT1\n"

// TestRaftAdmitsOnlyClusterNodes: on a node's port, a Raft connection is
// kept only from a node certificate of the cluster's CA.
func TestRaftAdmitsOnlyClusterNodes(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: 2, Secure: true})
	c.WaitReady()
	sec := c.Security
	sec.Issue(t, auth.RoleNode, "n4")
	for _, tc := range []struct {
		name  string
		cfg   *tls.Config // nil: plain TCP
		admit bool
	}{
		{"node certificate of the cluster", sec.ClientTLS(t, "n4"), true},
		{"client certificate of the cluster", sec.ClientTLS(t, "client"), false},
		{"admin certificate of the cluster", sec.ClientTLS(t, "admin"), false},
		{"no certificate", sec.ClientTLS(t, ""), false},
		{"node certificate of another CA", foreignCert(t, sec, auth.RoleNode), false},
		{"plain TCP", nil, false},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			raw, err := net.DialTimeout("tcp", c.Nodes[0].Addr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			conn := raw
			if tc.cfg != nil {
				cfg := tc.cfg.Clone()
				cfg.ServerName = "127.0.0.1"
				conn = tls.Client(raw, cfg)
			}
			hdr := make([]byte, len(raftMagic)+4)
			copy(hdr, raftMagic)
			binary.BigEndian.PutUint32(hdr[len(raftMagic):], 1)
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			_, werr := conn.Write(hdr)
			// Refused: the node closes the connection (or the handshake
			// fails). Admitted: the node waits for a Raft RPC.
			conn.SetReadDeadline(time.Now().Add(1500 * time.Millisecond))
			_, rerr := conn.Read(make([]byte, 1))
			var ne net.Error
			admitted := werr == nil && errors.As(rerr, &ne) && ne.Timeout()
			if admitted != tc.admit {
				t.Fatalf("admitted %v (write %v, read %v), want %v", admitted, werr, rerr, tc.admit)
			}
			if !tc.admit && rerr != nil && !errors.Is(rerr, io.EOF) && werr == nil {
				t.Logf("refused with %v", rerr)
			}
		})
	}
}

// TestProxySpeaksForItsCallers: a secured proxy checks callers itself and
// the nodes apply the caller's rights, not the proxy's.
func TestProxySpeaksForItsCallers(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: 2, Secure: true})
	c.WaitReady()
	sec := c.Security
	pf := sec.Files("proxy")
	serverTLS, err := pf.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	p, err := proxy.Start(ctxT(t, 30*time.Second), proxy.Config{
		Cluster: strings.Join(c.Endpoints(), ","), ListenAddr: "127.0.0.1:0", TLS: serverTLS, Policy: sec.Policy,
		ClientOptions: []client.Option{client.WithTLS(sec.ClientTLS(t, "proxy"))}, Logger: harness.Discard,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	ctx := ctxT(t, 60*time.Second)
	through := func(opts ...client.Option) *client.Client {
		cl, err := client.Dial(ctx, p.Addr(), append([]client.Option{client.WithProxyOnly()}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	restricted := through(client.WithTLS(sec.ClientTLS(t, "")), client.WithBearerToken(sec.ClientToken))
	if _, err := restricted.Insert(ctx, "demo/p", []byte("ok")); err != nil {
		t.Fatalf("restricted token under demo/: %v", err)
	}
	if _, err := restricted.Insert(ctx, "other/p", []byte("no")); !errors.Is(err, client.ErrPermission) {
		t.Fatalf("restricted token outside demo/: %v, want ErrPermission", err)
	}
	anonymous := through(client.WithTLS(sec.ClientTLS(t, "")))
	if _, err := anonymous.Insert(ctx, "demo/p", []byte("no")); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no credentials through the proxy: %v, want Unauthenticated", err)
	}
	plainClient := through(client.WithTLS(sec.ClientTLS(t, "client")))
	if _, err := plainClient.Purge(ctx, "demo/p"); !errors.Is(err, client.ErrPermission) {
		t.Fatalf("client certificate purge through the proxy: %v, want ErrPermission", err)
	}
	admin := through(client.WithTLS(sec.ClientTLS(t, "")), client.WithBearerToken(sec.AdminToken))
	if n, err := admin.Purge(ctx, "demo/p"); err != nil || n != 1 {
		t.Fatalf("admin token purge through the proxy: %d %v, want 1", n, err)
	}
	// The proxy relays a backup's copy only to an admin, and a refused
	// caller gets no byte of it.
	for name, cl := range map[string]*client.Client{"client certificate": plainClient, "restricted token": restricted, "anonymous": anonymous} {
		var buf bytes.Buffer
		_, err := cl.Backup(ctx, 1, &buf)
		if code := status.Code(err); code != codes.PermissionDenied && code != codes.Unauthenticated {
			t.Errorf("%s: backup through the proxy: %v, want PermissionDenied or Unauthenticated", name, err)
		}
		if buf.Len() > 0 {
			t.Errorf("%s: a refused backup through the proxy wrote %d bytes", name, buf.Len())
		}
	}
	var buf bytes.Buffer
	info, err := admin.Backup(ctx, 1, &buf)
	if err != nil || info.GetShard() != 1 || buf.Len() == 0 {
		t.Fatalf("admin token backup through the proxy: %v %v, %d bytes", info, err, buf.Len())
	}
}

// TestScopedTokenReachesOnlyItsQueues: a token limited to demo/ names tasks
// by id, routing by a queue under demo/, while the task lives in "demo" (the
// group's root queue, outside the prefix). Every operation that names it is
// PermissionDenied, directly and through a proxy, and the task is untouched;
// the same operations on a task under demo/ work.
func TestScopedTokenReachesOnlyItsQueues(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: 2, Secure: true})
	c.WaitReady()
	sec := c.Security
	pf := sec.Files("proxy")
	serverTLS, err := pf.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 90*time.Second)
	p, err := proxy.Start(ctx, proxy.Config{
		Cluster: strings.Join(c.Endpoints(), ","), ListenAddr: "127.0.0.1:0", TLS: serverTLS, Policy: sec.Policy,
		ClientOptions: []client.Option{client.WithTLS(sec.ClientTLS(t, "proxy"))}, Logger: harness.Discard,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	dialWith := func(addrs string, opts ...client.Option) *client.Client {
		cl, err := client.Dial(ctx, addrs, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	admin := dialWith(strings.Join(c.Endpoints(), ","), client.WithTLS(sec.ClientTLS(t, "admin")))
	paths := map[string]*client.Client{
		"direct": dialWith(strings.Join(c.Endpoints(), ","), client.WithTLS(sec.ClientTLS(t, "")), client.WithBearerToken(sec.ClientToken)),
		"proxy": dialWith(p.Addr(), client.WithProxyOnly(), client.WithTLS(sec.ClientTLS(t, "")),
			client.WithBearerToken(sec.ClientToken)),
	}
	root, err := admin.Insert(ctx, "demo", []byte("root's secret"))
	if err != nil {
		t.Fatal(err)
	}
	ref := &taskstorepb.TaskRef{Id: root.Id, Version: root.Version, Queue: "demo/x"}
	attacks := map[string]*taskstorepb.ModifyRequest{
		"change value":    {Changes: []*taskstorepb.TaskChange{{Id: root.Id, Version: root.Version, Queue: "demo/x", Value: []byte("mine")}}},
		"move into scope": {Changes: []*taskstorepb.TaskChange{{Id: root.Id, Version: root.Version, Queue: "demo/x", NewQueue: "demo/stolen"}}},
		"delete":          {Deletes: []*taskstorepb.TaskRef{ref}},
		"depend":          {Depends: []*taskstorepb.TaskRef{ref}, Inserts: []*taskstorepb.TaskInsert{{Queue: "demo/x", Value: []byte("n")}}},
		"delete and claim": {Deletes: []*taskstorepb.TaskRef{ref}, Claimant: "w",
			Claim: &taskstorepb.ModifyClaim{Queues: []string{"demo/x"}}},
	}
	for path, cl := range paths {
		for name, req := range attacks {
			t.Run(path+"/"+name, func(t *testing.T) {
				_, err := cl.Modify(ctx, proto.Clone(req).(*taskstorepb.ModifyRequest))
				if status.Code(err) != codes.PermissionDenied || !errors.Is(err, client.ErrPermission) {
					t.Fatalf("got %v, want PermissionDenied", err)
				}
				if strings.Contains(err.Error(), "root's secret") {
					t.Fatalf("the refusal shows the task's value: %v", err)
				}
			})
		}
		// The same shapes on a task under demo/ work.
		mine, err := cl.Insert(ctx, "demo/x", []byte("mine"))
		if err != nil {
			t.Fatalf("%s: insert under demo/: %v", path, err)
		}
		res, err := cl.Modify(ctx, &taskstorepb.ModifyRequest{Changes: []*taskstorepb.TaskChange{{Id: mine.Id, Version: mine.Version, Queue: "demo/x", NewQueue: "demo/y"}}})
		if err != nil || len(res.Changed) != 1 {
			t.Fatalf("%s: move a task under demo/: %v %v", path, res, err)
		}
		if err := cl.Delete(ctx, mine.Id, res.Changed[0].Version, client.InQueue("demo/y")); err != nil {
			t.Fatalf("%s: delete a task under demo/: %v", path, err)
		}
	}
	got, err := admin.Tasks(ctx, &taskstorepb.TasksRequest{Queue: "demo", Ids: []string{root.Id}})
	if err != nil || len(got.Tasks) != 1 {
		t.Fatalf("root task after the attacks: %v %v", got, err)
	}
	if tk := got.Tasks[0]; tk.Version != root.Version || tk.Queue != "demo" || string(tk.Value) != "root's secret" || tk.Claimant != root.Claimant {
		t.Fatalf("root task changed by a token scoped to demo/: %v", tk)
	}
	if got, err := admin.Tasks(ctx, &taskstorepb.TasksRequest{Queue: "demo/stolen"}); err != nil || len(got.Tasks) != 0 {
		t.Fatalf("demo/stolen: %v %v, want empty", got, err)
	}
}

// TestHTTPPortNeedsAdmin: on a secured node the --http port speaks HTTPS,
// the status page (task values) and value downloads need an admin
// credential, pprof is off, and metrics and health stay open (the
// port once served values, heap profiles and the gossip key in
// /debug/pprof/cmdline to anyone).
func TestHTTPPortNeedsAdmin(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 1, Scale: 2, Secure: true, HTTP: true})
	c.WaitReady()
	sec := c.Security
	ctx := ctxT(t, 60*time.Second)
	admin, err := client.Dial(ctx, strings.Join(c.Endpoints(), ","), client.WithTLS(sec.ClientTLS(t, "admin")))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	tk, err := admin.Insert(ctx, "demo/page", []byte("the value"))
	if err != nil {
		t.Fatal(err)
	}
	base := "https://" + c.Nodes[0].Server().HTTPAddr
	type cred struct {
		name   string
		tls    *tls.Config
		header string
	}
	basic := func(tok string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte("anyone:"+tok))
	}
	get := func(cr cred, path string) (int, string) {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cr.tls}, Timeout: 10 * time.Second}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		if cr.header != "" {
			req.Header.Set("Authorization", cr.header)
		}
		res, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", cr.name, path, err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	none := cred{name: "no credential", tls: sec.ClientTLS(t, "")}
	pages := []string{"/", "/queues/demo%2Fpage", "/queues/demo%2Fpage/tasks/" + tk.Id + "/value"}
	// The page reads this node's replicas (stale): wait until its replica
	// has the task, so that a 404 below can only mean a refusal gone wrong.
	adminCred := cred{"admin token", sec.ClientTLS(t, ""), "Bearer " + sec.AdminToken}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if code, _ := get(adminCred, pages[2]); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the node's replica never showed the task")
		}
	}
	for _, tc := range []struct {
		cred cred
		want int
	}{
		{none, http.StatusUnauthorized},
		{cred{"unknown token", sec.ClientTLS(t, ""), "Bearer not-a-token-of-this-cluster"}, http.StatusUnauthorized},
		{cred{"client token", sec.ClientTLS(t, ""), "Bearer " + sec.ClientToken}, http.StatusForbidden},
		{cred{"client certificate", sec.ClientTLS(t, "client"), ""}, http.StatusForbidden},
		{cred{"admin token", sec.ClientTLS(t, ""), "Bearer " + sec.AdminToken}, http.StatusOK},
		{cred{"admin token as basic password", sec.ClientTLS(t, ""), basic(sec.AdminToken)}, http.StatusOK},
		{cred{"admin certificate", sec.ClientTLS(t, "admin"), ""}, http.StatusOK},
	} {
		for _, path := range pages {
			code, body := get(tc.cred, path)
			if code != tc.want {
				t.Errorf("%s %s: %d, want %d (%.100s)", tc.cred.name, path, code, tc.want, body)
			}
			if code != http.StatusOK && strings.Contains(body, "the value") {
				t.Errorf("%s %s: refused, but the body shows the value", tc.cred.name, path)
			}
		}
	}
	if code, body := get(none, "/debug/pprof/cmdline"); code == http.StatusOK {
		t.Errorf("/debug/pprof/cmdline is served without --pprof: %.100s", body)
	}
	for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
		if code, _ := get(none, path); code != http.StatusOK {
			t.Errorf("%s without a credential: %d, want 200 (Prometheus and probes)", path, code)
		}
	}
	// Plain HTTP is not answered with the page.
	res, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + c.Nodes[0].Server().HTTPAddr + "/")
	if err == nil {
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if strings.Contains(string(b), "demo/page") {
			t.Error("the status page is served over plain HTTP")
		}
	}
}

// TestProxyHTTPChecksCallers: a proxy that checks callers serves its
// HTTP/JSON API over HTTPS through the same checks as gRPC (the API was switched off instead, because the in-process gateway
// skipped the interceptors). No credential is 401; a scoped token reaches
// only its queues (403 elsewhere); a client certificate works and may not
// purge; the admin token, as a basic-auth password, may; the refusals are
// counted in the proxy's gRPC metrics like any call.
func TestProxyHTTPChecksCallers(t *testing.T) {
	c := harness.Start(t, 3, harness.Options{Shards: 2, Scale: 2, Secure: true})
	c.WaitReady()
	sec := c.Security
	serverTLS, err := sec.Files("proxy").ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	p, err := proxy.Start(ctxT(t, 30*time.Second), proxy.Config{
		Cluster: strings.Join(c.Endpoints(), ","), ListenAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		TLS: serverTLS, Policy: sec.Policy,
		ClientOptions: []client.Option{client.WithTLS(sec.ClientTLS(t, "proxy"))}, Logger: harness.Discard,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	base := "https://" + p.HTTPAddr()
	httpsClient := func(cfg *tls.Config) *http.Client {
		return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	}
	anon := httpsClient(sec.ClientTLS(t, ""))
	withCert := httpsClient(sec.ClientTLS(t, "client"))
	do := func(hc *http.Client, method, path, body string, set func(*http.Request)) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctxT(t, 30*time.Second), method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if set != nil {
			set(req)
		}
		res, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	bearer := func(tok string) func(*http.Request) {
		return func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+tok) }
	}
	insert := func(queue string) string {
		return `{"inserts":[{"queue":"` + queue + `","value":"aGk="}]}`
	}
	// Wait for the proxy to know the cluster.
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, _ := do(anon, http.MethodGet, "/readyz", "", nil)
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("proxy not ready")
		}
		time.Sleep(100 * time.Millisecond)
	}

	if code, body := do(anon, http.MethodPost, "/v1/modify", insert("demo/h"), nil); code != http.StatusUnauthorized {
		t.Fatalf("no credential: %d %s, want 401", code, body)
	}
	if code, body := do(anon, http.MethodPost, "/v1/modify", insert("demo/h"), bearer("not-a-token")); code != http.StatusUnauthorized {
		t.Fatalf("unknown token: %d %s, want 401", code, body)
	}
	if code, body := do(anon, http.MethodPost, "/v1/modify", insert("demo/h"), bearer(sec.ClientToken)); code != http.StatusOK {
		t.Fatalf("scoped token under demo/: %d %s, want 200", code, body)
	}
	if code, body := do(anon, http.MethodPost, "/v1/modify", insert("other/h"), bearer(sec.ClientToken)); code != http.StatusForbidden || !strings.Contains(body, "demo/") {
		t.Fatalf("scoped token outside demo/: %d %s, want 403 naming its prefix", code, body)
	}
	if code, body := do(withCert, http.MethodPost, "/v1/modify", insert("other/h"), nil); code != http.StatusOK {
		t.Fatalf("client certificate: %d %s, want 200", code, body)
	}
	if code, body := do(withCert, http.MethodPost, "/v1/purge", `{"queue":"demo/h"}`, nil); code != http.StatusForbidden {
		t.Fatalf("client certificate purge: %d %s, want 403", code, body)
	}
	code, body := do(anon, http.MethodPost, "/v1/purge", `{"queue":"demo/h"}`, func(r *http.Request) { r.SetBasicAuth("admin", sec.AdminToken) })
	if code != http.StatusOK || !strings.Contains(body, `"deleted"`) {
		t.Fatalf("admin token purge: %d %s, want 200 with one deleted", code, body)
	}
	// The gateway's calls went through the proxy's gRPC interceptors.
	_, metrics := do(anon, http.MethodGet, "/metrics", "", nil)
	if !strings.Contains(metrics, `grpc_server_handled_total{grpc_code="PermissionDenied",grpc_method="Modify"`) {
		t.Fatalf("the refused HTTP Modify is not in the proxy's gRPC metrics:\n%s", grep(metrics, "grpc_server_handled_total"))
	}
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
