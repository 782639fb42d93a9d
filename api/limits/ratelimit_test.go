package limits

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func TestRateLimiterBuckets(t *testing.T) {
	type step struct {
		advance time.Duration
		key     string
		allowed bool
		wait    time.Duration // when refused: how long until a token
	}
	cases := []struct {
		name  string
		rate  float64
		burst int
		steps []step
	}{
		{"burst then refuse, refill at the rate", 2, 2, []step{
			{0, "a", true, 0},
			{0, "a", true, 0},
			{0, "a", false, 500 * time.Millisecond},
			{250 * time.Millisecond, "a", false, 250 * time.Millisecond},
			{250 * time.Millisecond, "a", true, 0},
			{0, "a", false, 500 * time.Millisecond},
		}},
		{"clients have their own buckets", 1, 1, []step{
			{0, "a", true, 0},
			{0, "a", false, time.Second},
			{0, "b", true, 0},
			{0, "b", false, time.Second},
		}},
		{"an idle client refills to the burst, not beyond", 10, 3, []step{
			{0, "a", true, 0},
			{0, "a", true, 0},
			{0, "a", true, 0},
			{time.Hour, "a", true, 0},
			{0, "a", true, 0},
			{0, "a", true, 0},
			{0, "a", false, 100 * time.Millisecond},
		}},
		{"burst 0 means one call at once", 5, 0, []step{
			{0, "a", true, 0},
			{0, "a", false, 200 * time.Millisecond},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clock := &fakeClock{t: time.Unix(1000, 0)}
			r := newRateLimiter(tc.rate, tc.burst, 100, clock.now)
			for i, s := range tc.steps {
				clock.advance(s.advance)
				ok, wait := r.allow(s.key)
				if ok != s.allowed || (!ok && (wait-s.wait).Abs() > time.Millisecond) {
					t.Fatalf("step %d (%s after %v): allowed %v wait %v, want %v %v", i, s.key, s.advance, ok, wait, s.allowed, s.wait)
				}
			}
		})
	}
}

func TestRateLimiterBoundsClients(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	r := newRateLimiter(1, 1, 10, clock.now)
	for i := range 100 {
		r.allow(fmt.Sprintf("client-%d", i))
		if r.size() > 10 {
			t.Fatalf("after %d clients: %d buckets kept, want at most 10", i+1, r.size())
		}
	}
	// The most recent client is still limited: eviction takes the least
	// recently used, not the newest.
	if ok, _ := r.allow("client-99"); ok {
		t.Fatal("client-99 was allowed a second call at once")
	}
}

func TestRateLimiterAnswersResourceExhaustedWithRetryInfo(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	r := newRateLimiter(4, 1, 100, clock.now)
	r.key = func(context.Context) string { return "ip:10.0.0.9" }
	const method = "/taskstore.v1.TaskStore/Modify"
	if err := r.check(context.Background(), method); err != nil {
		t.Fatalf("first call: %v", err)
	}
	err := r.check(context.Background(), method)
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("second call: %v, want ResourceExhausted", err)
	}
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			retry = ri
		}
	}
	if retry == nil || retry.RetryDelay.AsDuration() != 250*time.Millisecond {
		t.Fatalf("details %v: want RetryInfo of 250ms", st.Details())
	}
	// Health checks are never limited.
	for range 5 {
		if err := r.check(context.Background(), "/grpc.health.v1.Health/Check"); err != nil {
			t.Fatalf("health check limited: %v", err)
		}
	}
}
