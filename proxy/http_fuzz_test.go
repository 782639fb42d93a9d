package proxy_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/e1158ecb/taskstore/testing/harness"
)

// FuzzHTTPGateway sends arbitrary requests (method, path with query, body)
// to a proxy's HTTP handler in front of a real cluster: nothing panics,
// and nothing is the proxy's fault (500) — a request the API cannot take
// is 4xx, and only an unreachable cluster may be 503/504.
func FuzzHTTPGateway(f *testing.F) {
	f.Add("POST", "/v1/modify", []byte(`{"inserts":[{"queue":"fz/q","value":"aGk="}]}`))
	f.Add("POST", "/v1/claim", []byte(`{"queues":["fz/q"],"claimant":"w","wait":"0s"}`))
	f.Add("GET", "/v1/tasks?queue=fz/q&limit=3&omitValues=true", []byte(nil))
	f.Add("GET", "/v1/tasks?queue=%2Fx", []byte(nil))
	f.Add("GET", "/v1/queues?prefix=fz&limt=1", []byte(nil))
	f.Add("POST", "/v1/modify", []byte(`{"inserts":[{"queue":"fz/q","value":"not base64"}]}`))
	f.Add("POST", "/v1/modify", []byte("\xff\xfe{"))
	f.Add("DELETE", "/v1/queues/fz%2Fq", []byte(nil))

	c := harness.Start(f, 3, harness.Options{Shards: 2, Scale: 2})
	c.WaitReady()
	p := startProxy(f, c)
	h, err := p.HTTPHandler()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, method, target string, body []byte) {
		if !strings.HasPrefix(target, "/") {
			target = "/" + target
		}
		req, err := http.NewRequest(method, "http://proxy"+target, bytes.NewReader(body))
		if err != nil {
			return // not a request a client could send
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Grpc-Timeout", "2S")
		w := httptest.NewRecorder()
		done := make(chan struct{})
		go func() {
			defer close(done)
			h.ServeHTTP(w, req)
		}()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s %s hangs", method, target)
		}
		if w.Code == http.StatusInternalServerError || w.Code == http.StatusNotImplemented {
			t.Fatalf("%s %s %q: %d %s", method, target, body, w.Code, w.Body.String())
		}
	})
}
