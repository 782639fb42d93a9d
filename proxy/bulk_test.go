package proxy_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
)

// TestBulkInsertsOverHTTP posts many inserts in one request to a proxy's
// HTTP socket: each is answered alone and in order, a refused one (an id
// that exists) fails alone with its own code while the rest are stored, and
// a body that is not a list of inserts is refused as a whole.
func TestBulkInsertsOverHTTP(t *testing.T) {
	c := startCluster(t)
	p := startProxy(t, c)
	base := "http://" + p.HTTPAddr()
	post := func(body string) (int, []byte) {
		t.Helper()
		res, err := http.Post(base+"/v1/inserts", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		return res.StatusCode, b
	}
	if code, b := post(`{"inserts":[{"queue":"bulk/a","id":"taken"}]}`); code != 200 {
		t.Fatalf("a first insert: %d %s", code, b)
	}
	const n = 50
	var ins []string
	for i := range n {
		id := fmt.Sprint("t", i)
		if i == 7 {
			id = "taken"
		}
		q := []string{"bulk/a", "bulk/b", "other/c"}[i%3]
		if i == 7 {
			q = "bulk/a"
		}
		ins = append(ins, fmt.Sprintf(`{"queue":%q,"id":%q,"value":"aGk="}`, q, id))
	}
	code, b := post(`{"inserts":[` + strings.Join(ins, ",") + `]}`)
	if code != 200 {
		t.Fatalf("bulk: %d %s", code, b)
	}
	var out struct {
		Results []struct {
			Task *struct {
				ID, Queue, Value string
			}
			Error *struct {
				Code    codes.Code
				Message string
				Details []map[string]any
			}
		}
	}
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	if len(out.Results) != n {
		t.Fatalf("%d results for %d inserts: %s", len(out.Results), n, b)
	}
	for i, r := range out.Results {
		if i == 7 {
			if r.Error == nil || r.Error.Code != codes.FailedPrecondition || len(r.Error.Details) == 0 {
				t.Errorf("the insert of an existing id: %+v, want FailedPrecondition with details", r)
			}
			continue
		}
		if r.Error != nil || r.Task == nil || r.Task.ID != fmt.Sprint("t", i) || r.Task.Value != "aGk=" {
			t.Errorf("insert %d: %+v %+v", i, r.Task, r.Error)
		}
	}
	direct := dial(t, strings.Join(c.Endpoints(), ","))
	stored := 0
	for _, q := range []string{"bulk/a", "bulk/b", "other/c"} {
		stored += len(listAll(t, direct, q))
	}
	if want := n; stored != want { // 49 new and the first
		t.Errorf("%d tasks stored, want %d", stored, want)
	}
	for _, body := range []string{`{"inserts":[]}`, `{"insert":[{"queue":"bulk/a"}]}`, `{"inserts":[{"queue":"bulk/a","valu":"x"}]}`, `[1]`} {
		if code, b := post(body); code != http.StatusBadRequest || !strings.Contains(string(b), `"code":3`) {
			t.Errorf("%s: %d %s, want 400 InvalidArgument", body, code, b)
		}
	}
}
