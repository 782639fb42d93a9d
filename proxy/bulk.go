package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/auth"
)

// The bulk insert endpoint, POST /v1/inserts: many inserts in one HTTP
// request, each its own transaction with its own answer, in the order
// sent. It is not atomic (a Modify is: POST /v1/modify); one refused
// insert fails alone. The proxy sends them as the items of one Produce
// stream over its in-process connection (selfConn), so they take the path
// a gRPC caller's Produce stream takes: every interceptor (authentication,
// authorization of each item by its queue, the rate limit per item), then
// the proxy's own streams to the leaders, where inserts sent together
// share log entries. A hand route beside the generated gateway: a
// streaming call has no JSON binding.

// bulkRequest is the body of POST /v1/inserts; each insert is protojson
// (a TaskInsert, as in a Modify's inserts).
type bulkRequest struct {
	Inserts []json.RawMessage `json:"inserts"`
}

// bulkResult is one insert's answer: the task inserted, or the error (the
// gRPC status as JSON, as the gateway writes an error).
type bulkResult struct {
	Task  json.RawMessage `json:"task,omitempty"`
	Error json.RawMessage `json:"error,omitempty"`
}

// maxBulkInserts bounds the inserts of one bulk request.
const maxBulkInserts = 10_000

func (s *Server) serveBulkInserts(w http.ResponseWriter, r *http.Request) {
	var req bulkRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeHTTPStatus(w, status.Errorf(codes.InvalidArgument, "bulk inserts: the body is not {\"inserts\": [...]}: %v", err))
		return
	}
	if len(req.Inserts) == 0 || len(req.Inserts) > maxBulkInserts {
		writeHTTPStatus(w, status.Errorf(codes.InvalidArgument, "bulk inserts: %d inserts, want 1 to %d", len(req.Inserts), maxBulkInserts))
		return
	}
	items := make([]*taskstorepb.ProduceItem, len(req.Inserts))
	for i, raw := range req.Inserts {
		in := &taskstorepb.TaskInsert{}
		if err := protojson.Unmarshal(raw, in); err != nil {
			writeHTTPStatus(w, status.Errorf(codes.InvalidArgument, "bulk inserts: insert %d: %v", i, err))
			return
		}
		items[i] = &taskstorepb.ProduceItem{Id: uint64(i + 1), Modify: &taskstorepb.ModifyRequest{Inserts: []*taskstorepb.TaskInsert{in}}}
	}
	answers, err := s.produceSelf(r, items)
	if err != nil {
		writeHTTPStatus(w, err)
		return
	}
	out := make([]bulkResult, len(items))
	for i, it := range items {
		a := answers[it.Id]
		var res bulkResult
		switch {
		case a == nil:
			res.Error = statusJSON(status.New(codes.Unknown, "no answer"))
		case taskstorepb.AnswerError(a) != nil:
			res.Error = statusJSON(status.Convert(taskstorepb.AnswerError(a)))
		default:
			taskstorepb.ExpandInserted(a.Modify)
			if len(a.Modify.GetInserted()) != 1 {
				res.Error = statusJSON(status.Newf(codes.Internal, "%d tasks answered for one insert", len(a.Modify.GetInserted())))
				break
			}
			b, err := protojson.Marshal(a.Modify.Inserted[0])
			if err != nil {
				res.Error = statusJSON(status.Convert(err))
				break
			}
			res.Task = b
		}
		out[i] = res
	}
	w.Header().Set("Content-Type", "application/json")
	body, err := json.Marshal(map[string]any{"results": out})
	if err != nil {
		writeHTTPStatus(w, status.Errorf(codes.Internal, "bulk inserts: %v", err))
		return
	}
	w.Write(body)
}

// produceSelf sends items over one Produce stream of the proxy's
// in-process connection, as the caller of r, and returns the answers by
// item id. An error is the stream's: nothing was answered.
func (s *Server) produceSelf(r *http.Request, items []*taskstorepb.ProduceItem) (map[uint64]*taskstorepb.ProduceAnswer, error) {
	ctx := r.Context()
	if p, ok := ctx.Value(httpPrincipalKey{}).(auth.Principal); ok {
		p.Via = "http, " + p.Via
		ctx = metadata.NewOutgoingContext(ctx, p.Metadata())
	}
	st, err := taskstorepb.NewTaskStoreClient(s.self).Produce(ctx)
	if err != nil {
		return nil, err
	}
	sent := make(chan error, 1)
	go func() {
		// Messages of up to the size a node reads; the answers are read
		// meanwhile, so a long request never waits on its own answers.
		msg, size := &taskstorepb.ProduceRequest{}, 0
		for _, it := range items {
			n := proto.Size(it) + 16
			if len(msg.Items) > 0 && size+n > taskstorepb.MaxMessageBytes-64<<10 {
				if err := st.Send(msg); err != nil {
					sent <- err
					return
				}
				msg, size = &taskstorepb.ProduceRequest{}, 0
			}
			msg.Items = append(msg.Items, it)
			size += n
		}
		if err := st.Send(msg); err != nil {
			sent <- err
			return
		}
		sent <- st.CloseSend()
	}()
	answers := make(map[uint64]*taskstorepb.ProduceAnswer, len(items))
	for {
		res, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		for _, a := range res.Answers {
			answers[a.Id] = a
		}
	}
	if err := <-sent; err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return answers, nil
}

// statusJSON is st as the gateway writes an error: {"code", "message",
// "details"}.
func statusJSON(st *status.Status) json.RawMessage {
	b, err := protojson.Marshal(st.Proto())
	if err != nil {
		b, _ = json.Marshal(map[string]any{"code": codes.Internal, "message": fmt.Sprintf("encode an error: %v", err), "details": []any{}})
	}
	return b
}

// writeHTTPStatus answers the whole request with err's status, in the
// gateway's shape and with its HTTP code.
func writeHTTPStatus(w http.ResponseWriter, err error) {
	st := status.Convert(err)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(runtime.HTTPStatusFromCode(st.Code()))
	w.Write(statusJSON(st))
}
