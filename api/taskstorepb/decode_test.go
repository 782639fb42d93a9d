package taskstorepb

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// rawCodec sends bytes as they are: a caller writing the wire format itself.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)      { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error { *(v.(*[]byte)) = data; return nil }
func (rawCodec) Name() string                       { return "proto" }

// TestUndecodableRequestIsInvalidArgument: a request
// with invalid UTF-8 in a string field, or cut short, is the caller's
// fault: InvalidArgument, where grpc-go says Internal. A request that
// decodes reaches the service.
func TestUndecodableRequestIsInvalidArgument(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(ServerCodec())
	RegisterTaskStore(s, UnimplementedTaskStoreServer{})
	RegisterAdmin(s, UnimplementedAdminServer{})
	go s.Serve(l)
	t.Cleanup(s.Stop)
	cc, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	claimant := func(s string) []byte { // ModifyRequest.claimant = 1
		return protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), s)
	}
	for _, tc := range []struct {
		name, method string
		body         []byte
		want         codes.Code
	}{
		{"invalid UTF-8", "/taskstore.v1.TaskStore/Modify", claimant("w\xff\xfe"), codes.InvalidArgument},
		{"cut short", "/taskstore.v1.TaskStore/Modify", claimant("worker")[:4], codes.InvalidArgument},
		{"admin call, invalid UTF-8", "/taskstore.v1.Admin/RemoveNode", protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "n\xff"), codes.InvalidArgument},
		{"well formed", "/taskstore.v1.TaskStore/Modify", claimant("worker"), codes.Unimplemented},
	} {
		var out []byte
		err := cc.Invoke(ctx, tc.method, &tc.body, &out, grpc.ForceCodec(rawCodec{}))
		if status.Code(err) != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}
