package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/internal/tracing"
)

// selfConnBuffer is the in-memory connection's buffer per direction.
const selfConnBuffer = 1 << 20

// selfConn connects the HTTP gateway to the proxy's own gRPC server through
// an in-memory listener, so that an HTTP/JSON call passes the interceptors
// a gRPC call passes (metrics, authentication, authorization, rate limits)
// instead of calling the handlers directly (with callers
// checked, the HTTP/JSON API had to be off because it skipped them).
//
// With TLS, the gRPC server wants TLS on every listener, so the gateway
// speaks it over the pipe too, presenting the proxy's own certificate
// (role proxy, which may speak for another caller) and accepting only its
// own certificate from the other end: both ends are this process.
func selfConn(srv *grpc.Server, serverTLS *tls.Config) (*grpc.ClientConn, func(), error) {
	lis := bufconn.Listen(selfConnBuffer)
	go srv.Serve(lis)
	creds := insecure.NewCredentials()
	if serverTLS != nil {
		if len(serverTLS.Certificates) == 0 || len(serverTLS.Certificates[0].Certificate) == 0 {
			lis.Close()
			return nil, nil, errors.New("proxy: the HTTP gateway needs the proxy's TLS certificate")
		}
		own := serverTLS.Certificates[0]
		creds = credentials.NewTLS(&tls.Config{
			MinVersion:   tls.VersionTLS12,
			Certificates: []tls.Certificate{own},
			// The peer is this process: verify by identity, not by name.
			InsecureSkipVerify: true,
			VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
				if len(raw) == 0 || !bytes.Equal(raw[0], own.Certificate[0]) {
					return errors.New("proxy: the gateway's in-process peer is not this proxy")
				}
				return nil
			},
		})
	}
	cc, err := grpc.NewClient("passthrough:///proxy-gateway", append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(taskstorepb.MaxResponseBytes), grpc.MaxCallSendMsgSize(taskstorepb.MaxMessageBytes)),
	}, tracing.DialOptions(tracing.TracerProvider())...)...) // the HTTP request's span goes on as traceparent
	if err != nil {
		lis.Close()
		return nil, nil, err
	}
	return cc, func() { cc.Close(); lis.Close() }, nil
}
