package proxy_test

import (
	"context"
	"net"
	"runtime"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// BenchmarkRelayFloor measures the ceiling that gRPC alone puts on any
// proxied request on this machine: an empty unary call (grpc health Check)
// from 64 concurrent callers, straight to a server and through a relay
// that forwards it, all over loopback TCP in one process with every core
// to itself. No store, no Raft, no fsync. Reported as rpcs/s.
//
//	go test -run '^$' -bench RelayFloor -benchtime 5s ./proxy/
//
// The first throughput target (claim+delete through a proxy at 3x PostgreSQL)
// needs two proxied calls per task; docs/performance.md compares that with
// this floor.
func BenchmarkRelayFloor(b *testing.B) {
	backend := serveGRPC(b, func(s *grpc.Server) { healthpb.RegisterHealthServer(s, health.NewServer()) })
	relay := serveGRPC(b, func(s *grpc.Server) {
		healthpb.RegisterHealthServer(s, &healthRelay{up: healthpb.NewHealthClient(grpcConn(b, backend))})
	})
	for _, tc := range []struct{ name, addr string }{{"direct", backend}, {"relayed", relay}} {
		b.Run(tc.name, func(b *testing.B) {
			c := healthpb.NewHealthClient(grpcConn(b, tc.addr))
			// RunParallel starts parallelism x GOMAXPROCS callers.
			b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rpcs/s")
		})
	}
}

// healthRelay answers Check by asking its upstream, as the proxy forwards a
// request to a shard leader.
type healthRelay struct {
	healthpb.UnimplementedHealthServer
	up healthpb.HealthClient
}

func (r *healthRelay) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return r.up.Check(ctx, req)
}

func serveGRPC(b *testing.B, register func(*grpc.Server)) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	s := grpc.NewServer()
	register(s)
	go s.Serve(l)
	b.Cleanup(s.Stop)
	return l.Addr().String()
}
