// Package serving is what every server process of this module (a node, a
// proxy) sets up alike around its gRPC and HTTP listeners: the keepalive
// policy clients rely on, gRPC health flipped for every service at once,
// /healthz and /readyz, and the HTTPS side of --http. One copy, so that a
// node and a proxy cannot drift apart (four copies before).
package serving

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// Keepalive lets clients ping every few seconds (the client pings every
// 5 s to notice a vanished server) without being told to go away.
func Keepalive() grpc.ServerOption {
	return grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 2 * time.Second, PermitWithoutStream: true})
}

// ReusedWorkers runs calls on goroutines that outlive one call, whose
// stacks have grown to what a call needs: a new goroutine per call grows
// its stack on every call (runtime.newstack and copystack were 15% of the
// proxy's CPU). Beyond the workers, each call gets a goroutine of its own.
func ReusedWorkers() grpc.ServerOption { return grpc.NumStreamWorkers(streamWorkers) }

// streamWorkers is how many goroutines serve calls before more are
// started.
const streamWorkers = 64

// Services are the names gRPC health answers for: the server as a whole
// ("") and each API service.
var Services = []string{"", taskstorepb.TaskStore_ServiceDesc.ServiceName, taskstorepb.Admin_ServiceDesc.ServiceName}

// SetServing flips gRPC health for every service in Services.
func SetServing(h *health.Server, ok bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range Services {
		h.SetServingStatus(name, st)
	}
}

// HealthHandlers serves /healthz (200 while the process runs) and /readyz
// (200 while ready returns nil, else 503 with its error) on mux.
func HealthHandlers(mux *http.ServeMux, ready func() error) {
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
}

// HTTPTLS is the TLS of an --http port beside a gRPC port with grpcTLS: the
// same certificate; client certificates verified when given but not
// required, so that a token (or a browser's basic authentication),
// Prometheus and probes work without one; HTTP/1.1 and h2.
func HTTPTLS(grpcTLS *tls.Config) *tls.Config {
	c := grpcTLS.Clone()
	c.ClientAuth = tls.VerifyClientCertIfGiven
	c.NextProtos = []string{"h2", "http/1.1"}
	return c
}
