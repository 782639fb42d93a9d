package client

import (
	"crypto/tls"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/e1158ecb/taskstore/auth"
)

// WithTLS makes every connection TLS with cfg: its RootCAs verify the nodes'
// (or proxies') certificates, and its Certificates, if any, identify this
// client (the certificate's role decides what it may do). Load one from PEM
// files with auth.TLSFiles{Cert, Key, CA}.ClientConfig().
func WithTLS(cfg *tls.Config) Option {
	return WithDialOptions(grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
}

// WithBearerToken sends "authorization: Bearer token" with every call; the
// cluster maps the token to a role (see docs/security.md). Needs WithTLS:
// tokens are never sent in the clear.
func WithBearerToken(token string) Option {
	return WithDialOptions(grpc.WithPerRPCCredentials(auth.BearerToken(token)))
}
