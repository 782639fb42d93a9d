package serving

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestHealthHandlers(t *testing.T) {
	var notReady error = errors.New("routing table not known yet")
	mux := http.NewServeMux()
	HealthHandlers(mux, func() error { return notReady })
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get("/readyz"); code != 503 || body != "routing table not known yet\n" {
		t.Errorf("/readyz not ready: %d %q", code, body)
	}
	notReady = nil
	if code, body := get("/readyz"); code != 200 || body != "ready\n" {
		t.Errorf("/readyz ready: %d %q", code, body)
	}
}

func TestSetServingFlipsEveryService(t *testing.T) {
	h := health.NewServer()
	for _, ok := range []bool{true, false} {
		SetServing(h, ok)
		want := healthpb.HealthCheckResponse_NOT_SERVING
		if ok {
			want = healthpb.HealthCheckResponse_SERVING
		}
		for _, name := range Services {
			res, err := h.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
			if err != nil || res.Status != want {
				t.Errorf("serving %v: %q is %v %v", ok, name, res.GetStatus(), err)
			}
		}
	}
}

func TestHTTPTLSLeavesTheGRPCConfigAlone(t *testing.T) {
	g := &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, NextProtos: []string{"h2"}}
	h := HTTPTLS(g)
	if h.ClientAuth != tls.VerifyClientCertIfGiven || len(h.NextProtos) != 2 {
		t.Errorf("http TLS: %v %v", h.ClientAuth, h.NextProtos)
	}
	if g.ClientAuth != tls.RequireAndVerifyClientCert || len(g.NextProtos) != 1 {
		t.Errorf("the gRPC config changed: %v %v", g.ClientAuth, g.NextProtos)
	}
}
