package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/auth"
	"github.com/e1158ecb/taskstore/internal/serving"
	"github.com/e1158ecb/taskstore/internal/tracing"
	"github.com/e1158ecb/taskstore/rpc/pprofhttp"
)

// httpHandler serves /metrics, /healthz, /readyz, /debug/pprof when asked
// for (as the nodes do: the proxy's own cost shows in a profile; to admins
// when the proxy checks callers), the HTTP/JSON API and its OpenAPI
// description at /openapi.json (public, like /healthz: it is the same for
// every deployment and tells nothing about the data).
func (s *Server) httpHandler() (http.Handler, error) {
	gw, err := s.Gateway()
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", tracing.HTTP(limitBody(s.authenticateHTTP(gw))))
	mux.Handle("POST /v1/inserts", tracing.HTTP(limitBody(s.authenticateHTTP(http.HandlerFunc(s.serveBulkInserts)))))
	mux.HandleFunc("GET /openapi.json", serveOpenAPI)
	mux.Handle("/metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	serving.HealthHandlers(mux, s.Ready)
	if s.pprof {
		pprofhttp.Register(mux, s.policy)
	}
	return mux, nil
}

func serveOpenAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Write(taskstorepb.OpenAPI)
}

// authenticateHTTP establishes the caller of an API request when the proxy
// checks callers (a token in the Authorization header or as the basic-auth
// password, or a client certificate over HTTPS) and refuses one without a
// credential with 401, in the gateway's JSON error shape. What the caller
// may do is decided by the gRPC interceptors of the call the gateway makes
// for it (the principal travels in auth.PrincipalHeader).
func (s *Server) authenticateHTTP(h http.Handler) http.Handler {
	if !s.policy.Enabled() {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, code, err := s.policy.AuthenticateHTTP(r)
		if err != nil {
			s.policy.RefuseHTTP(w, r, p, code, err)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			body, _ := json.Marshal(map[string]any{"code": codes.Unauthenticated, "message": err.Error(), "details": []any{}})
			w.Write(body)
			return
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), httpPrincipalKey{}, p)))
	})
}

type httpPrincipalKey struct{}

// Gateway returns the HTTP/JSON face of the proxy's services: the handlers
// grpc-gateway generated from the proto and api/proto/taskstore/v1/
// taskstore_http.yaml (api/taskstorepb/taskstore.pb.gw.go), calling the
// proxy's own gRPC server over an in-process connection (selfConn), so
// that every interceptor applies. Bodies and answers are protobuf's
// canonical JSON; unknown fields are refused (a typo must not silently
// become a default); errors carry the gRPC status as JSON, details included,
// with the HTTP code grpc-gateway maps it to. docs/http.md lists the
// endpoints.
func (s *Server) Gateway() (http.Handler, error) {
	if s.self == nil {
		return nil, errors.New("proxy: http gateway: no in-process connection")
	}
	mux := runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.JSONPb{
			MarshalOptions:   protojson.MarshalOptions{},
			UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
		}),
		runtime.SetQueryParameterParser(strictQueryParser{}), // process-wide in grpc-gateway: every gateway here is strict
		runtime.WithRoutingErrorHandler(routingError),
		runtime.WithErrorHandler(httpError),
		runtime.WithMetadata(func(ctx context.Context, r *http.Request) metadata.MD {
			if p, ok := r.Context().Value(httpPrincipalKey{}).(auth.Principal); ok {
				p.Via = "http, " + p.Via
				return p.Metadata()
			}
			return nil
		}),
	)
	ctx := context.Background()
	if err := taskstorepb.RegisterTaskStoreHandler(ctx, mux, s.self); err != nil {
		return nil, fmt.Errorf("proxy: http gateway: %w", err)
	}
	if err := taskstorepb.RegisterAdminHandler(ctx, mux, s.self); err != nil {
		return nil, fmt.Errorf("proxy: http gateway: %w", err)
	}
	return mux, nil
}

// MaxJSONBodyBytes bounds an HTTP/JSON request body: a request the nodes
// accept over gRPC (taskstorepb.MaxMessageBytes), with room for JSON's
// base64 values (4/3) and field names.
const MaxJSONBodyBytes = taskstorepb.MaxMessageBytes * 3 / 2

// limitBody refuses a body over MaxJSONBodyBytes with 413 before the
// gateway decodes it: by its Content-Length when it gives one, else after
// reading at most the limit (a chunked body). Without it a 100 MB body took
// the proxy to 459 MB.
func limitBody(h http.Handler) http.Handler {
	tooLarge := func(w http.ResponseWriter, n string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		b, _ := json.Marshal(map[string]any{"code": codes.ResourceExhausted,
			"message": fmt.Sprintf("request body %s over the limit of %d bytes", n, MaxJSONBodyBytes), "details": []any{}})
		w.Write(b)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !utf8.ValidString(r.URL.Path) {
			// A path segment becomes a string field (a queue name),
			// which protobuf will not encode.
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			b, _ := json.Marshal(map[string]any{"code": codes.InvalidArgument, "message": "the path is not valid UTF-8", "details": []any{}})
			w.Write(b)
			return
		}
		if r.ContentLength > MaxJSONBodyBytes {
			tooLarge(w, fmt.Sprintf("of %d bytes is", r.ContentLength))
			return
		}
		if r.ContentLength < 0 && r.Body != nil {
			b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxJSONBodyBytes))
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				tooLarge(w, "is")
				return
			}
			if err != nil {
				http.Error(w, "read the request body: "+err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
			r.ContentLength = int64(len(b))
		} else if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, MaxJSONBodyBytes)
		}
		h.ServeHTTP(w, r)
	})
}

// strictQueryParser refuses a query parameter that names no field of the
// request (a typo such as ?limt=5 or ?stal=true), as unknown body fields
// are refused, instead of dropping it silently; then parses as the
// gateway's default does. The gateway answers its error 400.
type strictQueryParser struct{ runtime.DefaultQueryParser }

func (p strictQueryParser) Parse(msg proto.Message, values url.Values, filter *utilities.DoubleArray) error {
	md := msg.ProtoReflect().Descriptor()
	for key, vs := range values {
		if err := knownField(md, key); err != nil {
			return err
		}
		for _, v := range vs {
			if !utf8.ValidString(v) {
				return fmt.Errorf("query parameter %q: not valid UTF-8", key)
			}
		}
	}
	return p.DefaultQueryParser.Parse(msg, values, filter)
}

// knownField checks that a dotted query key (by JSON or proto field names)
// names a field of md; a map field takes its entries as FIELD[KEY] (the
// gateway's syntax: headers[tenant]=acme).
func knownField(md protoreflect.MessageDescriptor, key string) error {
	field := key
	if i := strings.IndexByte(key, '['); i > 0 && strings.HasSuffix(key, "]") {
		field = key[:i]
	}
	path := strings.Split(field, ".")
	for i, name := range path {
		fd := md.Fields().ByJSONName(name)
		if fd == nil {
			fd = md.Fields().ByName(protoreflect.Name(name))
		}
		if fd == nil {
			return fmt.Errorf("unknown query parameter %q: %s has no field %q", key, md.FullName(), name)
		}
		if field != key && i == len(path)-1 && !fd.IsMap() {
			return fmt.Errorf("unknown query parameter %q: %s is not a map", key, fd.FullName())
		}
		if i < len(path)-1 {
			if fd.Message() == nil {
				return fmt.Errorf("unknown query parameter %q: %s is not a message", key, fd.FullName())
			}
			md = fd.Message()
		}
	}
	return nil
}

// routingError answers a method the path does not take with 405 (the
// gateway's default says 501, "not implemented", which blames the server);
// other routing errors as the gateway does.
func routingError(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, httpStatus int) {
	if httpStatus != http.StatusMethodNotAllowed {
		runtime.DefaultRoutingErrorHandler(ctx, mux, m, w, r, httpStatus)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusMethodNotAllowed)
	b, _ := json.Marshal(map[string]any{"code": codes.Unimplemented, "message": fmt.Sprintf("%s is not a method of %s", r.Method, r.URL.Path), "details": []any{}})
	w.Write(b)
}

// httpError answers as grpc-gateway does, with a hint where its decoder's
// words do not say what to send: protojson takes a Duration as seconds
// ("60s"), and users type Go's "1m".
func httpError(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	if s, ok := status.FromError(err); ok && s.Code() == codes.InvalidArgument && strings.Contains(s.Message(), "google.protobuf.Duration value") {
		err = status.Error(codes.InvalidArgument, s.Message()+`: a duration is seconds with an "s", e.g. "60s" or "1.5s" (not "1m")`)
	}
	runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, err)
}
