package proxy_test

import (
	"bytes"
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi2"
	"github.com/getkin/kin-openapi/openapi2conv"
	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
)

// loadOpenAPI fetches /openapi.json from a proxy, checks it is the
// generated document, and converts it from Swagger 2.0 (what
// protoc-gen-openapiv2 writes) to OpenAPI 3 (what kin-openapi validates
// requests and answers against), validating it on the way.
func loadOpenAPI(t *testing.T, base string) *openapi3.T {
	t.Helper()
	res, err := http.Get(base + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/json" || !bytes.Equal(b, taskstorepb.OpenAPI) {
		t.Fatalf("/openapi.json: HTTP %d, %s, %d bytes, want the generated document", res.StatusCode, res.Header.Get("Content-Type"), len(b))
	}
	var v2 openapi2.T
	if err := v2.UnmarshalJSON(b); err != nil {
		t.Fatalf("/openapi.json is not Swagger 2.0: %v", err)
	}
	doc, err := openapi2conv.ToV3(&v2)
	if err != nil {
		t.Fatalf("converting to OpenAPI 3: %v", err)
	}
	doc.Servers = openapi3.Servers{{URL: base}}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("the OpenAPI document does not validate: %v", err)
	}
	return doc
}

// gatewayRoutes reads the routes the generated gateway registers
// (api/taskstorepb/taskstore.pb.gw.go: a mux.Handle(method, pattern_X, ...)
// for each, and pattern_X = runtime.MustPattern(runtime.NewPattern(...))),
// rebuilding each pattern with grpc-gateway itself, as "METHOD /path/{var}".
func gatewayRoutes(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../api/taskstorepb/taskstore.pb.gw.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	patterns := map[string]string{}
	methods := map[string][]string{}
	var failed error
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ValueSpec:
			if len(n.Names) != 1 || len(n.Values) != 1 || !strings.HasPrefix(n.Names[0].Name, "pattern_") {
				return true
			}
			must, ok := n.Values[0].(*ast.CallExpr)
			if !ok || len(must.Args) != 1 {
				return true
			}
			np, ok := must.Args[0].(*ast.CallExpr)
			if !ok || len(np.Args) != 4 {
				return true
			}
			version, _ := strconv.Atoi(np.Args[0].(*ast.BasicLit).Value)
			var ops []int
			for _, e := range np.Args[1].(*ast.CompositeLit).Elts {
				v, _ := strconv.Atoi(e.(*ast.BasicLit).Value)
				ops = append(ops, v)
			}
			var pool []string
			for _, e := range np.Args[2].(*ast.CompositeLit).Elts {
				s, _ := strconv.Unquote(e.(*ast.BasicLit).Value)
				pool = append(pool, s)
			}
			verb, _ := strconv.Unquote(np.Args[3].(*ast.BasicLit).Value)
			p, err := runtime.NewPattern(version, ops, pool, verb)
			if err != nil {
				failed = err
				return false
			}
			patterns[n.Names[0].Name] = p.String()
		case *ast.CallExpr:
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Handle" || len(n.Args) != 3 {
				return true
			}
			m, ok1 := n.Args[0].(*ast.SelectorExpr)
			p, ok2 := n.Args[1].(*ast.Ident)
			if ok1 && ok2 && strings.HasPrefix(m.Sel.Name, "Method") {
				methods[p.Name] = append(methods[p.Name], strings.ToUpper(strings.TrimPrefix(m.Sel.Name, "Method")))
			}
		}
		return true
	})
	if failed != nil {
		t.Fatal(failed)
	}
	// grpc-gateway writes a path variable as {name=*}; OpenAPI as {name}.
	capture := regexp.MustCompile(`\{([^}=]+)=\*\}`)
	var routes []string
	for name, ms := range methods {
		path, ok := patterns[name]
		if !ok {
			t.Fatalf("%s is registered but its pattern was not found", name)
		}
		for _, m := range ms {
			routes = append(routes, m+" "+capture.ReplaceAllString(path, "{$1}"))
		}
	}
	slices.Sort(routes)
	return slices.Compact(routes)
}

// notAPI are the routes of the proxy's HTTP mux outside the API, which the
// document does not describe (docs/operations.md does). Health checks
// (serving.HealthHandlers) and profiles (pprofhttp.Register) are registered
// by other packages, outside /v1/ too.
var notAPI = []string{"/metrics", "GET /openapi.json"}

// handRoutes reads the routes the proxy registers on its HTTP mux itself
// (every Handle or HandleFunc call in the package's non-test files), as
// "METHOD /path": the gateway's "/v1/" left out (gatewayRoutes lists what
// it serves), and those of notAPI. A route registered without a literal
// pattern, or outside /v1/ and not in notAPI, fails the test: it must be
// described (api/proto/taskstore/v1/taskstore_openapi_hand.json, merged by
// `make proto`) or said to be no part of the API.
func handRoutes(t *testing.T) []string {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var routes []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || (sel.Sel.Name != "Handle" && sel.Sel.Name != "HandleFunc") || len(call.Args) != 2 {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				t.Fatalf("%s: a route whose pattern is not a literal: this test cannot tell whether it is described", fset.Position(call.Pos()))
			}
			pattern, _ := strconv.Unquote(lit.Value)
			switch {
			case pattern == "/v1/" || slices.Contains(notAPI, pattern):
			case strings.Contains(pattern, " /v1/"):
				routes = append(routes, pattern)
			default:
				t.Fatalf("%s: route %q is neither an API route (METHOD /v1/...) nor listed in notAPI", fset.Position(call.Pos()), pattern)
			}
			return true
		})
	}
	if len(routes) == 0 {
		t.Fatal("no hand-registered API route found: is the proxy's mux still in this package?")
	}
	return routes
}

// TestOpenAPI: the proxy serves an OpenAPI document that validates,
// describes every API route of its HTTP mux (the gateway's and those it
// serves by hand) and no other, and whose schemas the requests and answers
// follow, against a real cluster.
func TestOpenAPI(t *testing.T) {
	c := startCluster(t)
	p := startProxy(t, c)
	base := "http://" + p.HTTPAddr()
	doc := loadOpenAPI(t, base)

	gw := append(gatewayRoutes(t), handRoutes(t)...)
	slices.Sort(gw)
	var described []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			described = append(described, method+" "+path)
		}
	}
	slices.Sort(described)
	if len(gw) < 20 || !slices.Equal(gw, described) {
		t.Fatalf("the proxy serves\n  %s\nthe document describes\n  %s", strings.Join(gw, "\n  "), strings.Join(described, "\n  "))
	}
	t.Logf("%d routes, each described", len(gw))

	// Answers must carry only the fields the document names: protoc-gen-openapiv2
	// leaves additionalProperties open, which would let a field the document
	// lacks (or misnames) through. google.protobuf.Any is open by design.
	for name, s := range doc.Components.Schemas {
		if s.Value != nil && s.Value.Type.Is("object") && len(s.Value.Properties) > 0 && name != "protobufAny" {
			no := false
			s.Value.AdditionalProperties = openapi3.AdditionalProperties{Has: &no}
		}
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	call := func(method, path, body string, wantStatus int) []byte {
		t.Helper()
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
		if err != nil {
			t.Fatal(err)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		route, params, err := router.FindRoute(req)
		if err != nil {
			t.Fatalf("%s %s: not in the document: %v", method, path, err)
		}
		in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
			Options: &openapi3filter.Options{MultiError: true}}
		if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
			t.Fatalf("%s %s %s: the request does not follow the document: %v", method, path, body, err)
		}
		// ValidateRequest read the body; send it again.
		if body != "" {
			req.Body = io.NopCloser(strings.NewReader(body))
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != wantStatus {
			t.Fatalf("%s %s %s: HTTP %d %s, want %d", method, path, body, res.StatusCode, b, wantStatus)
		}
		out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: res.StatusCode,
			Header: res.Header, Body: io.NopCloser(bytes.NewReader(b)),
			Options: &openapi3filter.Options{MultiError: true, IncludeResponseStatus: true}}
		if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
			t.Errorf("%s %s: the answer does not follow the document: %v\n%s", method, path, err, b)
		}
		return b
	}

	call("POST", "/v1/modify", `{"inserts":[{"queue":"oa/work","id":"oa-1","value":"aGk=","priority":3,"key":"k1","delay":"0s"}]}`, 200)
	call("POST", "/v1/modify", `{"inserts":[{"queue":"oa/work","id":"oa-2","at":"2030-01-02T03:04:05Z"}]}`, 200)
	// A duplicate: the error shape (a google.rpc.Status with a ModifyError detail).
	call("POST", "/v1/modify", `{"inserts":[{"queue":"oa/work","id":"oa-1"}]}`, 400)
	if b := call("POST", "/v1/claim", `{"queues":["oa/work"],"claimant":"w1","lease":"30s","limit":2}`, 200); !strings.Contains(string(b), `"oa-1"`) {
		t.Fatalf("claim: %s", b)
	}
	// Bulk inserts (a hand route): one stored, one refused, each its own result.
	if b := call("POST", "/v1/inserts", `{"inserts":[{"queue":"oa/work","id":"oa-3","value":"aGk=","priority":1},{"queue":"oa/work","id":"oa-1"}]}`, 200); !strings.Contains(string(b), `"oa-3"`) || !strings.Contains(string(b), `"error"`) {
		t.Fatalf("bulk inserts: %s", b)
	}
	call("POST", "/v1/inserts", `{"inserts":[]}`, 400)
	call("POST", "/v1/policy", `{"queue":"oa/work","policy":{"maxClaims":5,"deadLetter":"oa/dead","rate":50}}`, 200)
	call("GET", "/v1/tasks?queue=oa/work&limit=10", "", 200)
	call("GET", "/v1/tasks?ids=oa-1&ids=oa-2&queue=oa/work", "", 200)
	call("POST", "/v1/tasks", `{"queue":"oa/work","ids":["oa-1"]}`, 200)
	call("GET", "/v1/queues?prefix=oa/", "", 200)
	call("POST", "/v1/pause", `{"queue":"oa/work"}`, 200)
	call("POST", "/v1/resume", `{"queue":"oa/work"}`, 200)
	call("POST", "/v1/limit", `{"queue":"oa/work","maxClaimed":5}`, 200)
	call("POST", "/v1/schedules", `{"schedule":{"name":"nightly","queue":"oa/work","cron":"0 2 * * *","timeZone":"Europe/Berlin"}}`, 200)
	call("GET", "/v1/schedules?prefix=oa/", "", 200)
	call("GET", "/v1/time", "", 200)
	call("GET", "/v1/status", "", 200)
	call("GET", "/v1/routing", "", 200)
	call("POST", "/v1/nodes/n9/remove", `{}`, 404)
}
