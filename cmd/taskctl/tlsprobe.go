package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// tlsRefusedError is a call that failed because the cluster refused this
// client's TLS credentials, found by probeTLS after the client gave up.
type tlsRefusedError struct {
	addr  string
	cause error // the probe's error, e.g. "remote error: tls: certificate required"
	call  error // what the call itself reported
}

func (e *tlsRefusedError) Error() string {
	return fmt.Sprintf("%s refused this client's TLS connection: %v (the call reported: %v)", e.addr, e.cause, e.call)
}

// probeTLS asks each endpoint, with the client's own TLS configuration,
// whether it refuses the connection. Under TLS 1.3 a server that requires a
// client certificate completes the handshake and only then sends its
// "certificate required" alert; a client that writes first sees "broken
// pipe" or "connection reset" instead of the reason (the race gRPC loses
// from time to time). Reading before writing receives the alert. A server
// that accepts the connection sends nothing, and the read times out: no
// diagnosis.
func probeTLS(ctx context.Context, endpoints string, cfg *tls.Config, wait time.Duration) (string, error) {
	for _, addr := range strings.Split(endpoints, ",") {
		addr = strings.TrimSpace(addr)
		if addr == "" {
			continue
		}
		if err := probeOne(ctx, addr, cfg, wait); err != nil {
			return addr, err
		}
	}
	return "", nil
}

func probeOne(ctx context.Context, addr string, cfg *tls.Config, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	d := tls.Dialer{Config: cfg.Clone()}
	if host, _, err := net.SplitHostPort(addr); err == nil && d.Config.ServerName == "" {
		d.Config.ServerName = host
	}
	d.Config.NextProtos = []string{"h2"}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return refusal(err)
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	conn.SetReadDeadline(deadline)
	_, err = conn.Read(make([]byte, 1))
	return refusal(err)
}

// refusal keeps err only when it is the TLS peer's verdict on the
// credentials: a timeout or a network error says nothing about them.
func refusal(err error) error {
	if err == nil {
		return nil
	}
	var rec tls.RecordHeaderError
	var cert *tls.CertificateVerificationError
	// A received alert is a *net.OpError "remote error" around an
	// unexported type: only its text names it.
	if errors.As(err, &rec) || errors.As(err, &cert) || strings.Contains(err.Error(), "remote error: tls:") {
		return err
	}
	return nil
}
