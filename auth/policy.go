package auth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// PrincipalHeader carries the principal a proxy (or node) authenticated to
// the node it forwards to.
const PrincipalHeader = "x-taskstore-principal"

// Principal is an authenticated caller.
type Principal struct {
	Name string
	Role string
	// Prefixes limits a client to queues whose names start with one of
	// them; nil means every queue.
	Prefixes []string
	// Via says how the principal was established: cert, token, proxy, none.
	Via string
}

// encode is the PrincipalHeader value.
// Metadata is the outgoing metadata by which a node or proxy speaks for
// p (PrincipalHeader), for callers that build their metadata whole (the
// proxy's HTTP gateway) rather than through WithPrincipal.
func (p Principal) Metadata() metadata.MD { return metadata.Pairs(PrincipalHeader, p.encode()) }

func (p Principal) encode() string {
	v := url.Values{"role": {p.Role}, "name": {p.Name}, "via": {p.Via}}
	if p.Prefixes != nil {
		v["prefix"] = p.Prefixes
	}
	return v.Encode()
}

func decodePrincipal(s string) (Principal, error) {
	v, err := url.ParseQuery(s)
	if err != nil {
		return Principal{}, err
	}
	p := Principal{Role: v.Get("role"), Name: v.Get("name"), Via: v.Get("via"), Prefixes: v["prefix"]}
	if !slices.Contains(Roles, p.Role) {
		return Principal{}, fmt.Errorf("unknown role %q", p.Role)
	}
	return p, nil
}

// String names the principal in logs and errors.
func (p Principal) String() string {
	return fmt.Sprintf("%s %q (%s)", p.Role, p.Name, p.Via)
}

// AllowsQueue reports whether the principal may use a queue.
func (p Principal) AllowsQueue(q string) bool {
	if p.Role != RoleClient || p.Prefixes == nil {
		return true
	}
	for _, pre := range p.Prefixes {
		if strings.HasPrefix(q, pre) {
			return true
		}
	}
	return false
}

type principalKey struct{}

// FromContext returns the principal the policy authenticated for a call.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// WithPrincipal returns ctx carrying p, for the call's handler, and with p in
// the outgoing metadata, so that a proxy forwarding with ctx speaks for its
// caller.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	ctx = context.WithValue(ctx, principalKey{}, p)
	return metadata.AppendToOutgoingContext(ctx, PrincipalHeader, p.encode())
}

// Policy authenticates callers and decides what they may call. The zero
// Policy (no tokens, no required certificates) allows everything: TLS then
// only encrypts.
type Policy struct {
	// Tokens are the accepted bearer tokens (nil: none).
	Tokens *Tokens
	// Required refuses callers that present neither a token nor a client
	// certificate. Set it when tokens or client certificates are in use.
	Required bool
	Log      *slog.Logger
}

// Enabled reports whether the policy checks anything.
func (pol *Policy) Enabled() bool { return pol != nil && (pol.Required || pol.Tokens.Len() > 0) }

// Authenticate establishes the caller of an incoming call.
func (pol *Policy) Authenticate(ctx context.Context) (Principal, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	var cert *Principal
	if pr, ok := peer.FromContext(ctx); ok {
		if ti, ok := pr.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 {
			leaf := ti.State.VerifiedChains[0][0]
			cert = &Principal{Name: leaf.Subject.CommonName, Role: RoleOf(leaf), Via: "cert"}
		}
	}
	if vals := md.Get(PrincipalHeader); len(vals) > 0 {
		if cert == nil || (cert.Role != RoleProxy && cert.Role != RoleNode) {
			return Principal{}, status.Errorf(codes.PermissionDenied, "only a node or proxy certificate may speak for another caller (%s)", PrincipalHeader)
		}
		p, err := decodePrincipal(vals[len(vals)-1])
		if err != nil {
			return Principal{}, status.Errorf(codes.InvalidArgument, "bad %s: %v", PrincipalHeader, err)
		}
		if p.Role == RoleNode && cert.Role != RoleNode {
			// A node's identity is its own certificate: a proxy speaking
			// "for a node" would reach what only nodes may do (the Peer
			// service, the wipe of a replica).
			return Principal{}, status.Errorf(codes.PermissionDenied, "%s (role %s) may not speak for a caller with role node", cert.Name, cert.Role)
		}
		p.Via = "via " + cert.Name + ", " + p.Via
		return p, nil
	}
	if vals := md.Get("authorization"); len(vals) > 0 {
		tok, ok := strings.CutPrefix(vals[0], "Bearer ")
		if !ok {
			return Principal{}, status.Error(codes.Unauthenticated, `authorization metadata must be "Bearer TOKEN"`)
		}
		p, ok := pol.Tokens.Lookup(strings.TrimSpace(tok))
		if !ok {
			return Principal{}, status.Error(codes.Unauthenticated, "unknown bearer token")
		}
		return p, nil
	}
	if cert != nil {
		return *cert, nil
	}
	if pol.Enabled() {
		return Principal{}, status.Error(codes.Unauthenticated, "no client certificate or bearer token: this cluster requires one (see docs/security.md)")
	}
	return Principal{Name: "anonymous", Role: RoleAdmin, Via: "none"}, nil
}

// Method permissions.
const (
	permAny    = iota // every authenticated caller
	permClient        // task operations; queue prefixes apply
	permAdmin         // admin and node only
)

var methodPerms = map[string]int{
	"/taskstore.v1.TaskStore/Modify": permClient,
	"/taskstore.v1.TaskStore/Claim":  permClient,
	// Each item of the stream is authorized as the Modify it is, by the
	// node that applies it.
	"/taskstore.v1.TaskStore/Produce": permClient,
	"/taskstore.v1.TaskStore/Tasks":   permClient,
	"/taskstore.v1.TaskStore/Queues":  permClient,
	"/taskstore.v1.TaskStore/Time":    permClient,
	"/taskstore.v1.TaskStore/Purge":   permAdmin,
	// Pausing stops every worker of a queue: an operator's act, like purge.
	"/taskstore.v1.TaskStore/PauseQueue":  permAdmin,
	"/taskstore.v1.TaskStore/ResumeQueue": permAdmin,
	// A concurrency limit throttles every worker of a queue: the same.
	"/taskstore.v1.TaskStore/SetQueueLimit":  permAdmin,
	"/taskstore.v1.TaskStore/SetQueuePolicy": permAdmin,
	// Schedules insert tasks into their queues: a client may manage those
	// of queues it may use.
	"/taskstore.v1.TaskStore/PutSchedule":    permClient,
	"/taskstore.v1.TaskStore/DeleteSchedule": permClient,
	"/taskstore.v1.TaskStore/Schedules":      permClient,
	"/taskstore.v1.Admin/Status":             permAny,
	"/taskstore.v1.Admin/Routing":            permAny,
	"/taskstore.v1.Admin/TransferLeader":     permAdmin,
	"/taskstore.v1.Admin/AddNode":            permAdmin,
	"/taskstore.v1.Admin/RemoveNode":         permAdmin,
	"/taskstore.v1.Admin/RebuildReplica":     permAdmin,
	"/taskstore.v1.Admin/MoveSlots":          permAdmin,
	"/taskstore.v1.Admin/AddShards":          permAdmin,
	"/taskstore.v1.Admin/RemoveShard":        permAdmin,
	"/taskstore.v1.Admin/RebalanceSlots":     permAdmin,
	// A backup holds every task value of the cluster.
	"/taskstore.v1.Admin/Backup": permAdmin,
	// The nodes' internal service (cluster/peerpb): nodes, and admins
	// debugging them.
	"/taskstore.peer.v1.Peer/Report":        permAdmin,
	"/taskstore.peer.v1.Peer/Clock":         permAdmin,
	"/taskstore.peer.v1.Peer/MetaReadIndex": permAdmin,
	"/grpc.health.v1.Health/Check":          permAny,
	"/grpc.health.v1.Health/Watch":          permAny,
	"/grpc.health.v1.Health/List":           permAny,
}

// wipeReplicaMethod deletes a replica's files: only a node asks (the
// shard's leader, after removing the replica from its group).
const wipeReplicaMethod = "/taskstore.peer.v1.Peer/WipeReplica"

// nodeOnly are the internal calls only a node makes: they change or read
// shards beneath the API (a replica's files; a slot move's steps, which
// the meta leader's slot mover sends).
var nodeOnly = map[string]bool{
	wipeReplicaMethod:                    true,
	"/taskstore.peer.v1.Peer/SlotStep":   true,
	"/taskstore.peer.v1.Peer/ExportSlot": true,
	"/taskstore.peer.v1.Peer/SlotLoad":   true,
}

// Authorize decides whether p may call method with req (nil for streams).
// Unknown methods (reflection, future calls) need the admin role.
func Authorize(p Principal, method string, req any) error {
	perm, known := methodPerms[method]
	if !known {
		perm = permAdmin
	}
	short := method[strings.LastIndex(method, "/")+1:]
	switch perm {
	case permAdmin:
		if p.Role != RoleAdmin && p.Role != RoleNode {
			return status.Errorf(codes.PermissionDenied, "%s needs the admin role; %s has role %s", short, p.Name, p.Role)
		}
		// Deleting a replica's files is safe only after its shard's leader
		// removed it from the group: only a node (that leader) asks for it.
		if r, ok := req.(*taskstorepb.RebuildReplicaRequest); ok && r.GetWipe() && p.Role != RoleNode {
			return status.Errorf(codes.PermissionDenied, "%s with wipe is sent by the shard's leader only; %s has role %s", short, p.Name, p.Role)
		}
		if nodeOnly[method] && p.Role != RoleNode {
			return status.Errorf(codes.PermissionDenied, "%s is sent by nodes only; %s has role %s", short, p.Name, p.Role)
		}
	case permClient:
		for _, q := range queuesOf(req) {
			if !p.AllowsQueue(q) {
				return status.Errorf(codes.PermissionDenied, "%s may use queues under %s only, not %q",
					p.Name, strings.Join(p.Prefixes, ", "), q)
			}
		}
	}
	return nil
}

// queuesOf lists the queue names a task request touches. A request that
// names no queue where a restricted client needs one (a listing by shard,
// a queue listing without a prefix) yields "" so that it is refused.
func queuesOf(req any) []string {
	var qs []string
	switch r := req.(type) {
	case *taskstorepb.ModifyRequest:
		for _, in := range r.GetInserts() {
			qs = append(qs, in.GetQueue())
		}
		for _, ch := range r.GetChanges() {
			qs = append(qs, ch.GetQueue())
			if ch.GetNewQueue() != "" {
				qs = append(qs, ch.GetNewQueue())
			}
		}
		for _, ref := range append(r.GetDeletes(), r.GetDepends()...) {
			qs = append(qs, ref.GetQueue())
		}
		qs = append(qs, r.GetClaim().GetQueues()...)
	case *taskstorepb.ClaimRequest:
		qs = r.GetQueues()
	case *taskstorepb.TasksRequest:
		qs = append(qs, r.GetQueue())
	case *taskstorepb.QueuesRequest:
		qs = append(qs, r.GetPrefix())
	case *taskstorepb.PurgeRequest:
		qs = append(qs, r.GetQueue())
	case *taskstorepb.PutScheduleRequest:
		qs = append(qs, r.GetSchedule().GetQueue())
	case *taskstorepb.DeleteScheduleRequest:
		qs = append(qs, r.GetQueue())
	case *taskstorepb.SchedulesRequest:
		qs = append(qs, r.GetPrefix())
	}
	return qs
}

// UnaryServerInterceptor authenticates and authorizes every unary call and
// puts the principal in the handler's context.
func (pol *Policy) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		p, err := pol.check(ctx, info.FullMethod, req)
		if err != nil {
			return nil, err
		}
		return handler(WithPrincipal(ctx, p), req)
	}
}

// StreamServerInterceptor authenticates and authorizes streams by method
// and puts the principal in the stream's context: a proxy relaying a
// stream (Backup) speaks for its caller, as for a unary call.
func (pol *Policy) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		p, err := pol.check(ss.Context(), info.FullMethod, nil)
		if err != nil {
			return err
		}
		return handler(srv, &principalStream{ServerStream: ss, ctx: WithPrincipal(ss.Context(), p)})
	}
}

// principalStream is a server stream whose context carries the principal.
type principalStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *principalStream) Context() context.Context { return s.ctx }

func (pol *Policy) check(ctx context.Context, method string, req any) (Principal, error) {
	p, err := pol.Authenticate(ctx)
	if err == nil && pol.Enabled() {
		err = Authorize(p, method, req)
	}
	if err != nil && pol.Log != nil {
		addr := ""
		if pr, ok := peer.FromContext(ctx); ok {
			addr = pr.Addr.String()
		}
		pol.Log.Warn("call refused", "method", method, "peer", addr, "principal", p.Name, "role", p.Role,
			"code", status.Code(err).String(), "err", status.Convert(err).Message())
	}
	return p, err
}

// RequireAdminHTTP guards h (a node's status page and value downloads)
// when the policy is enabled: the caller must be an admin or a node, by a
// verified client certificate, an "Authorization: Bearer TOKEN" header, or
// HTTP basic authentication with the token as the password (what a browser
// can send). Without a credential the answer is 401 with a Basic challenge;
// with another role, 403. h finds the caller with FromContext. A disabled
// policy returns h unchanged (no principal in the context).
func (pol *Policy) RequireAdminHTTP(h http.Handler) http.Handler {
	return pol.RequireAdminHTTPFor("the status page shows every queue's tasks", h)
}

// RequireAdminHTTPFor is RequireAdminHTTP for another page; why says what
// the page exposes, in the 403's message.
func (pol *Policy) RequireAdminHTTPFor(why string, h http.Handler) http.Handler {
	if !pol.Enabled() {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, code, err := pol.AuthenticateHTTP(r)
		if err == nil && p.Role != RoleAdmin && p.Role != RoleNode {
			code, err = http.StatusForbidden, fmt.Errorf("%s: it needs the admin role; %s has role %s", why, p.Name, p.Role)
		}
		if err != nil {
			pol.RefuseHTTP(w, r, p, code, err)
			http.Error(w, err.Error(), code)
			return
		}
		// The handler learns who is asking: the status page offers its
		// actions to admins only.
		h.ServeHTTP(w, r.WithContext(WithPrincipal(r.Context(), p)))
	})
}

// RefuseHTTP logs a refused HTTP request as the gRPC interceptor logs a
// refused call and, for 401, sets the Basic challenge a browser answers.
// The caller writes the status and body after it (their formats differ: the
// status page's is text, the HTTP/JSON API's a JSON status).
func (pol *Policy) RefuseHTTP(w http.ResponseWriter, r *http.Request, p Principal, code int, err error) {
	if pol.Log != nil {
		pol.Log.Warn("http request refused", "path", r.URL.Path, "peer", r.RemoteAddr, "principal", p.Name, "role", p.Role, "code", code, "err", err)
	}
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Basic realm="taskstore", charset="UTF-8"`)
	}
}

// AuthenticateHTTP establishes the caller of an HTTP request as
// Authenticate does for gRPC: an "Authorization: Bearer TOKEN" header, HTTP
// basic authentication with the token as the password, or a verified
// client certificate. On failure it returns the HTTP status to answer
// (401). It does not authorize: a gRPC call made for the principal is.
func (pol *Policy) AuthenticateHTTP(r *http.Request) (Principal, int, error) {
	if h := r.Header.Get("Authorization"); h != "" {
		tok, ok := strings.CutPrefix(h, "Bearer ")
		if !ok {
			if _, pw, basic := r.BasicAuth(); basic {
				tok, ok = pw, true
			}
		}
		if !ok {
			return Principal{}, http.StatusUnauthorized, errors.New(`authorization must be "Bearer TOKEN" or basic authentication with the token as the password`)
		}
		p, found := pol.Tokens.Lookup(strings.TrimSpace(tok))
		if !found {
			return Principal{}, http.StatusUnauthorized, errors.New("unknown token")
		}
		return p, 0, nil
	}
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		leaf := r.TLS.VerifiedChains[0][0]
		return Principal{Name: leaf.Subject.CommonName, Role: RoleOf(leaf), Via: "cert"}, 0, nil
	}
	return Principal{}, http.StatusUnauthorized, errors.New("this cluster requires a credential: a token (bearer, or as the basic-auth password) or a client certificate (see docs/security.md)")
}
