package taskstorepb

import (
	"context"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// A request that does not decode (a string field with invalid UTF-8, a
// message cut short) is the caller's fault: InvalidArgument. grpc-go
// answers it Internal ("grpc: failed to unmarshal the received message"),
// which says "our bug" and invites retries, and since v1.85 it writes that
// status itself before the handler sees the error. So the server codec
// (ServerCodec) lets a request of these services that does not decode
// through as an empty message, noting why, and the registered handlers
// (RegisterTaskStore, RegisterAdmin) answer InvalidArgument right after
// decoding, before anything else runs. Use the two together.

// ServerCodec is the server option that goes with RegisterTaskStore and
// RegisterAdmin.
func ServerCodec() grpc.ServerOption {
	return grpc.ForceServerCodecV2(ServerCodecV2())
}

// ServerCodecV2 is the codec of ServerCodec, for a server that wraps it in
// a codec of its own (grpc.ForceServerCodecV2).
func ServerCodecV2() encoding.CodecV2 {
	return lenientCodec{encoding.GetCodecV2(protoenc.Name)}
}

// undecoded holds, per request message, why it did not decode, from the
// codec's Unmarshal to the handler's decode callback on the same call.
var undecoded sync.Map

type lenientCodec struct{ encoding.CodecV2 }

func (c lenientCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok || !strings.HasPrefix(string(m.ProtoReflect().Descriptor().FullName()), "taskstore.v1.") {
		return err // other services (health) keep grpc-go's answer
	}
	proto.Reset(m)
	undecoded.Store(v, err)
	return nil
}

// RegisterTaskStore registers the service as RegisterTaskStoreServer does,
// answering a request that did not decode InvalidArgument (see
// ServerCodec).
func RegisterTaskStore(s grpc.ServiceRegistrar, srv TaskStoreServer) {
	s.RegisterService(badRequestsInvalid(&TaskStore_ServiceDesc), srv)
}

// RegisterAdmin: see RegisterTaskStore.
func RegisterAdmin(s grpc.ServiceRegistrar, srv AdminServer) {
	s.RegisterService(badRequestsInvalid(&Admin_ServiceDesc), srv)
}

func badRequestsInvalid(desc *grpc.ServiceDesc) *grpc.ServiceDesc {
	d := *desc
	d.Methods = make([]grpc.MethodDesc, len(desc.Methods))
	for i, m := range desc.Methods {
		h := m.Handler
		m.Handler = func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			return h(srv, ctx, func(v any) error {
				if err := dec(v); err != nil {
					return err
				}
				if why, ok := undecoded.LoadAndDelete(v); ok {
					return status.Errorf(codes.InvalidArgument, "malformed request: %v", why)
				}
				return nil
			}, icpt)
		}
		d.Methods[i] = m
	}
	return &d
}
