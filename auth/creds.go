package auth

import (
	"context"
	"errors"
	"net"

	"google.golang.org/grpc/credentials"
)

// AcceptedTLS returns gRPC server credentials for connections that arrive
// already TLS-terminated: the node's listener is wrapped in TLS below the
// connection mux (so Raft and gRPC share the port and the handshake), and
// gRPC must not handshake again. It exposes the connection's TLS state as
// credentials.TLSInfo, so peer certificates reach the authorization policy.
func AcceptedTLS() credentials.TransportCredentials { return acceptedTLS{} }

type acceptedTLS struct{}

func (acceptedTLS) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	cs := ConnState(c)
	if cs == nil {
		return nil, nil, errors.New("auth: connection was not TLS-terminated by the listener")
	}
	return c, credentials.TLSInfo{State: *cs, CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}, nil
}

func (acceptedTLS) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("auth: AcceptedTLS is for servers only")
}

func (acceptedTLS) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}

func (a acceptedTLS) Clone() credentials.TransportCredentials { return a }

func (acceptedTLS) OverrideServerName(string) error { return nil }
