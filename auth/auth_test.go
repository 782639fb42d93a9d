package auth

import (
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

func TestParseTokens(t *testing.T) {
	for _, tc := range []struct {
		name, text, err string
		check           func(t *testing.T, tk *Tokens)
	}{
		{name: "roles, prefixes and names", text: "# comment\n\n0123456789abcdef admin\nfedcba9876543210 client jobs/,mail/ workers\nxxxxxxxxxxxxxxxx client * all-queues\n",
			check: func(t *testing.T, tk *Tokens) {
				if p, ok := tk.Lookup("0123456789abcdef"); !ok || p.Role != RoleAdmin {
					t.Errorf("admin token: %+v %v", p, ok)
				}
				p, ok := tk.Lookup("fedcba9876543210")
				if !ok || p.Role != RoleClient || p.Name != "workers" || strings.Join(p.Prefixes, ",") != "jobs/,mail/" {
					t.Errorf("client token: %+v %v", p, ok)
				}
				if p, _ := tk.Lookup("xxxxxxxxxxxxxxxx"); p.Prefixes != nil {
					t.Errorf("'*' should allow every queue: %+v", p)
				}
				if _, ok := tk.Lookup("0123456789abcdeF"); ok {
					t.Error("a different token matched")
				}
			}},
		{name: "short token", text: "short admin\n", err: "shorter than 16"},
		{name: "unknown role", text: "0123456789abcdef root\n", err: "unknown role"},
		{name: "prefix splitting a group", text: "0123456789abcdef client jobs/a\n", err: "splits a consistency group"},
		{name: "prefix on admin", text: "0123456789abcdef admin jobs/\n", err: "client role only"},
		{name: "duplicate", text: "0123456789abcdef admin\n0123456789abcdef client\n", err: "listed twice"},
		{name: "too many prefixes", text: "0123456789abcdef client " + strings.Repeat("a-,", MaxPrefixes) + "b-\n", err: "more than the limit"},
		{name: "too many fields", text: "0123456789abcdef client a/ b c\n", err: "fields"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk, err := ParseTokens(tc.text)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, tk)
		})
	}
}

func TestAuthorize(t *testing.T) {
	admin := Principal{Name: "a", Role: RoleAdmin}
	node := Principal{Name: "n1", Role: RoleNode}
	proxy := Principal{Name: "p", Role: RoleProxy}
	anyClient := Principal{Name: "c", Role: RoleClient}
	jobs := Principal{Name: "j", Role: RoleClient, Prefixes: []string{"jobs/"}}
	modify := func(queues ...string) *taskstorepb.ModifyRequest {
		r := &taskstorepb.ModifyRequest{}
		for _, q := range queues {
			r.Inserts = append(r.Inserts, &taskstorepb.TaskInsert{Queue: q})
		}
		return r
	}
	const ts, ad = "/taskstore.v1.TaskStore/", "/taskstore.v1.Admin/"
	for _, tc := range []struct {
		p      Principal
		method string
		req    any
		want   codes.Code
	}{
		{admin, ad + "RemoveNode", nil, codes.OK},
		{node, ad + "AddNode", nil, codes.OK},
		{proxy, ad + "TransferLeader", nil, codes.PermissionDenied},
		{admin, ad + "RebuildReplica", &taskstorepb.RebuildReplicaRequest{Shard: 1, Node: "n2"}, codes.OK},
		{anyClient, ad + "RebuildReplica", &taskstorepb.RebuildReplicaRequest{Shard: 1, Node: "n2"}, codes.PermissionDenied},
		// Deleting a replica's files: only the shard's leader, a node.
		{admin, ad + "RebuildReplica", &taskstorepb.RebuildReplicaRequest{Shard: 1, Node: "n2", Wipe: true}, codes.PermissionDenied},
		{node, ad + "RebuildReplica", &taskstorepb.RebuildReplicaRequest{Shard: 1, Node: "n2", Wipe: true}, codes.OK},
		// The nodes' internal service: nodes (and admins, to debug), never
		// clients or proxies; the wipe, only nodes.
		{node, "/taskstore.peer.v1.Peer/Report", nil, codes.OK},
		{admin, "/taskstore.peer.v1.Peer/Clock", nil, codes.OK},
		{proxy, "/taskstore.peer.v1.Peer/Report", nil, codes.PermissionDenied},
		{node, "/taskstore.peer.v1.Peer/MetaReadIndex", nil, codes.OK},
		{proxy, "/taskstore.peer.v1.Peer/MetaReadIndex", nil, codes.PermissionDenied},
		{anyClient, "/taskstore.peer.v1.Peer/Clock", nil, codes.PermissionDenied},
		{node, "/taskstore.peer.v1.Peer/WipeReplica", nil, codes.OK},
		{admin, "/taskstore.peer.v1.Peer/WipeReplica", nil, codes.PermissionDenied},
		{node, "/taskstore.peer.v1.Peer/SlotStep", nil, codes.OK},
		{admin, "/taskstore.peer.v1.Peer/SlotStep", nil, codes.PermissionDenied},
		{admin, "/taskstore.peer.v1.Peer/ExportSlot", nil, codes.PermissionDenied},
		{admin, "/taskstore.v1.Admin/MoveSlots", nil, codes.OK},
		{anyClient, "/taskstore.v1.Admin/MoveSlots", nil, codes.PermissionDenied},
		{anyClient, ts + "Purge", &taskstorepb.PurgeRequest{Queue: "x/y"}, codes.PermissionDenied},
		// Pausing stops a queue's workers: an operator's act.
		{anyClient, ts + "PauseQueue", &taskstorepb.QueuePauseRequest{Queue: "x/y"}, codes.PermissionDenied},
		{anyClient, ts + "ResumeQueue", &taskstorepb.QueuePauseRequest{Queue: "x/y"}, codes.PermissionDenied},
		{admin, ts + "PauseQueue", &taskstorepb.QueuePauseRequest{Queue: "x/y"}, codes.OK},
		{anyClient, ts + "SetQueueLimit", &taskstorepb.QueueLimitRequest{Queue: "x/y", MaxClaimed: 1}, codes.PermissionDenied},
		{admin, ts + "SetQueueLimit", &taskstorepb.QueueLimitRequest{Queue: "x/y", MaxClaimed: 1}, codes.OK},
		// Schedules insert into their queues: a client manages those of its
		// prefixes only.
		{jobs, ts + "PutSchedule", &taskstorepb.PutScheduleRequest{Schedule: &taskstorepb.Schedule{Name: "n", Queue: "jobs/a"}}, codes.OK},
		{jobs, ts + "PutSchedule", &taskstorepb.PutScheduleRequest{Schedule: &taskstorepb.Schedule{Name: "n", Queue: "other/a"}}, codes.PermissionDenied},
		{jobs, ts + "DeleteSchedule", &taskstorepb.DeleteScheduleRequest{Name: "n", Queue: "other/a"}, codes.PermissionDenied},
		{jobs, ts + "Schedules", &taskstorepb.SchedulesRequest{}, codes.PermissionDenied},
		{jobs, ts + "Schedules", &taskstorepb.SchedulesRequest{Prefix: "jobs/"}, codes.OK},
		{anyClient, ts + "Modify", modify("x/y"), codes.OK},
		{anyClient, ad + "Routing", nil, codes.OK},
		{anyClient, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", nil, codes.PermissionDenied},
		{jobs, ts + "Modify", modify("jobs/a", "jobs/b"), codes.OK},
		{jobs, ts + "Modify", modify("jobs/a", "mail/b"), codes.PermissionDenied},
		{jobs, ts + "Modify", &taskstorepb.ModifyRequest{Changes: []*taskstorepb.TaskChange{{Queue: "jobs/a", NewQueue: "mail/a"}}}, codes.PermissionDenied},
		{jobs, ts + "Modify", &taskstorepb.ModifyRequest{Deletes: []*taskstorepb.TaskRef{{Queue: "mail/a"}}}, codes.PermissionDenied},
		{jobs, ts + "Modify", &taskstorepb.ModifyRequest{Depends: []*taskstorepb.TaskRef{{Queue: "jobs/a"}}}, codes.OK},
		// A commit's claim is a claim: its queues count.
		{jobs, ts + "Modify", &taskstorepb.ModifyRequest{Deletes: []*taskstorepb.TaskRef{{Queue: "jobs/a"}},
			Claim: &taskstorepb.ModifyClaim{Queues: []string{"jobs/a", "mail/a"}}}, codes.PermissionDenied},
		{jobs, ts + "Modify", &taskstorepb.ModifyRequest{Claim: &taskstorepb.ModifyClaim{Queues: []string{"jobs/a"}}}, codes.OK},
		{jobs, ts + "Claim", &taskstorepb.ClaimRequest{Queues: []string{"jobs/a", "mail/a"}}, codes.PermissionDenied},
		{jobs, ts + "Tasks", &taskstorepb.TasksRequest{Shard: 1}, codes.PermissionDenied}, // a shard listing names no queue
		{jobs, ts + "Queues", &taskstorepb.QueuesRequest{}, codes.PermissionDenied},
		{jobs, ts + "Queues", &taskstorepb.QueuesRequest{Prefix: "jobs/"}, codes.OK},
		{jobs, ts + "Time", &taskstorepb.TimeRequest{}, codes.OK},
	} {
		if got := status.Code(Authorize(tc.p, tc.method, tc.req)); got != tc.want {
			t.Errorf("%s calling %s with %v: %v, want %v", tc.p, tc.method, tc.req, got, tc.want)
		}
	}
}

func TestVerifyNode(t *testing.T) {
	ca, err := NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewCA("other", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	parse := func(c *CA, role string) []*x509.Certificate {
		is, err := c.Issue(role, "x", nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := pem.Decode(is.CertPEM)
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return []*x509.Certificate{cert}
	}
	if err := VerifyNode(parse(ca, RoleNode), roots); err != nil {
		t.Errorf("node of the CA: %v", err)
	}
	if err := VerifyNode(parse(ca, RoleAdmin), roots); err == nil {
		t.Error("admin certificate accepted as a node")
	}
	if err := VerifyNode(parse(other, RoleNode), roots); err == nil {
		t.Error("node certificate of another CA accepted")
	}
	if err := VerifyNode(nil, roots); err == nil {
		t.Error("no certificate accepted")
	}
}
