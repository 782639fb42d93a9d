package client

import (
	"context"
	"crypto/tls"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// WithTLS makes every connection TLS with cfg: its RootCAs verify the nodes'
// (or proxies') certificates, and its Certificates, if any, identify this
// client (the certificate's role decides what it may do). Load one from PEM
// files with auth.TLSFiles{Cert, Key, CA}.ClientConfig() (package auth).
func WithTLS(cfg *tls.Config) Option {
	return WithDialOptions(grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
}

// WithBearerToken sends "authorization: Bearer token" with every call; the
// cluster maps the token to a role (see docs/security.md). Needs WithTLS:
// tokens are never sent in the clear.
func WithBearerToken(token string) Option {
	return WithDialOptions(grpc.WithPerRPCCredentials(BearerToken(token)))
}

// BearerToken returns per-RPC credentials that send "authorization: Bearer
// token" with every call (for a grpc.ClientConn of one's own; WithBearerToken
// for a Client). They require TLS: a token sent in the clear is a token
// given away. Here rather than in auth, so that a client does not link the
// servers' policy code.
func BearerToken(token string) credentials.PerRPCCredentials { return bearer(token) }

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return true }
