package client

import (
	"context"
	"testing"
	"time"
)

func TestAttemptTimeoutLeavesRoomForASecondNode(t *testing.T) {
	long, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	short, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	tiny, cancel3 := context.WithTimeout(context.Background(), time.Second)
	defer cancel3()
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		extra  time.Duration
		lo, hi time.Duration
	}{
		{"no deadline", context.Background(), 0, 10 * time.Second, 10 * time.Second},
		{"far deadline", long, 0, 10 * time.Second, 10 * time.Second},
		{"10s left: half", short, 0, 4900 * time.Millisecond, 5 * time.Second},
		{"1s left: floor", tiny, 0, minAttempt, minAttempt},
		{"waiting claim keeps its wait", short, 20 * time.Second, 30 * time.Second, 30 * time.Second},
	} {
		if got := attemptTimeout(tc.ctx, 10*time.Second, tc.extra); got < tc.lo || got > tc.hi {
			t.Errorf("%s: %v, want %v..%v", tc.name, got, tc.lo, tc.hi)
		}
	}
}
