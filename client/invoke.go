package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
)

// target says where a request goes.
type target struct {
	// group: the leader of the shard that owns this consistency group.
	group string
	// shard: the leader of this shard (when group is empty).
	shard uint32
	// anyNode: any node that answers (Status, Routing, Time).
	anyNode bool
}

func (t target) String() string {
	switch {
	case t.anyNode:
		return "any node"
	case t.group != "":
		return fmt.Sprintf("group %q", t.group)
	}
	return fmt.Sprintf("shard %d", t.shard)
}

// call runs fn against the right node until it succeeds, fails for good, or
// ctx ends. It is the one retry loop of the Client:
//
//  1. A NotLeader answer with the leader's address is followed at once (a
//     few hops at most before backing off) and recorded in the table.
//  2. Unavailable, a server-side deadline, a broken connection or an
//     attempt's own timeout mark the table stale and retry after a pause
//     (exponential backoff, full jitter); a node that failed twice in a row
//     is avoided for one attempt.
//  3. Everything else is returned at once, decoded into the Client's errors.
//
// fn must be safe to repeat: mutating requests carry one request id for
// every attempt. extra lengthens the attempt timeout (a Claim's wait).
func (c *Client) call(ctx context.Context, op string, t target, extra time.Duration, fn func(ctx context.Context, cc *grpc.ClientConn) error) (err error) {
	ctx, span := startCall(ctx, c.opts.tracer, op)
	defer func() { endCall(span, err) }()
	var (
		lastErr error
		hint    string // follow this leader address next
		failed  string // the address that failed last (without a hint)
		avoid   string // an address that failed twice in a row
		hops    int
		bound   = c.opts.backoffBase
		tried   attempts
	)
	for attempt := 0; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return giveUp(op, t, err, lastErr, tried)
		}
		addr := hint
		hint = ""
		if addr == "" {
			var err error
			if addr, err = c.rt.pick(ctx, t, attempt, avoid); err != nil {
				if errors.Is(err, ErrClosed) || errors.Is(err, ErrPermission) {
					return err // a refused caller will not be admitted by retrying
				}
				if errors.Is(err, ErrInvalid) {
					return fmt.Errorf("%s: %w", strings.ToLower(op), err)
				}
				lastErr = err
				if !pause(ctx, &bound, c.opts.backoffMax) {
					return giveUp(op, t, ctx.Err(), lastErr, tried)
				}
				continue
			}
		}
		cc, err := c.conn(addr)
		if err != nil {
			return err
		}
		// Any node answers a read of the cluster (Status, Routing, Time),
		// and one that holds a live connection is not gone: it gets the
		// whole attempt, not half of what is left. Halving made an answer
		// that takes a little over half of --timeout (a node under load
		// asking its peers) fail every time.
		connected := cc.GetState() == connectivity.Ready
		actx, cancel := ctx, context.CancelFunc(func() {})
		if c.opts.attemptTimeout > 0 {
			base := attemptTimeout(ctx, c.opts.attemptTimeout, extra)
			if t.anyNode && connected {
				base = c.opts.attemptTimeout
			}
			actx, cancel = context.WithTimeout(ctx, base)
		}
		start := time.Now()
		err = fn(actx, cc)
		attemptExpired := actx.Err() != nil && ctx.Err() == nil
		cancel()
		if err == nil {
			return nil
		}
		err = decode(op, addr, err)
		reached := connected || cc.GetState() == connectivity.Ready
		tried.add(addr, time.Since(start), reached, err)
		if attemptExpired && status.Code(err) == codes.DeadlineExceeded {
			err = fmt.Errorf("%s: attempt at %s timed out: %w", op, addr, context.DeadlineExceeded)
		}
		if ctx.Err() != nil {
			if !onlyTimedOut(err) {
				lastErr = err
			}
			return giveUp(op, t, ctx.Err(), lastErr, tried)
		}
		if !retryable(ctx, err) {
			return err
		}
		if lastErr == nil || !onlyTimedOut(err) {
			lastErr = err // a bare timeout does not hide why an earlier attempt failed
		}
		avoid = ""
		// A node that could not be reached (its process is gone: the
		// connection was refused or reset) or that knows no leader means
		// the shard is electing one, which takes about an election
		// timeout and ends at a moment no backoff can predict: poll for
		// the new leader every failoverPause at most instead of backing
		// off for seconds, so a write goes through soon after the
		// election. An overloaded node still answers, and still gets the
		// full backoff.
		var nl *NotLeaderError
		down := !reached && status.Code(err) == codes.Unavailable
		if down || errors.As(err, &nl) && nl.LeaderAddress == "" {
			bound = min(bound, failoverPause)
		}
		switch {
		case errors.As(err, &nl) && !c.opts.proxyOnly:
			if nl.LeaderAddress != "" && nl.LeaderAddress != addr {
				c.rt.setLeader(nl.Shard, nl.LeaderID, nl.LeaderAddress)
				if t.shard != 0 && nl.Shard != t.shard || t.group != "" && !c.rt.owns(nl.Shard, t.group) {
					c.rt.markStale() // the group moved to another shard
				}
				if hops++; hops <= c.opts.maxHops {
					hint = nl.LeaderAddress
					c.log.Debug("following leader hint", "op", op, "shard", nl.Shard, "leader", nl.LeaderAddress)
					continue
				}
			} else {
				c.rt.forgetLeader(nl.Shard, addr)
				avoid = addr
			}
		case !c.opts.proxyOnly:
			// A live leader that could not commit (election, unknown
			// outcome) is worth a second try; after two failures in a
			// row, try another replica, which knows the new leader. An
			// attempt that timed out may have met a node that is gone
			// (no answer at all): go elsewhere at once.
			c.rt.markStale()
			if addr == failed || attemptExpired || down {
				avoid = addr
			}
			if attemptExpired || down {
				// Remember it beyond this call too (a caller's retry is a
				// new call): route the shard to another replica until the
				// table says otherwise.
				if shard, ok := c.rt.shardOfTarget(t); ok {
					c.rt.forgetLeader(shard, addr)
				}
			}
			failed = addr
		}
		hops = 0
		c.log.Debug("retrying", "op", op, "target", t.String(), "addr", addr, "attempt", attempt, "err", err)
		if !pause(ctx, &bound, c.opts.backoffMax) {
			return giveUp(op, t, ctx.Err(), lastErr, tried)
		}
	}
}

// owns reports whether the table maps group to shard.
func (r *router) owns(shard uint32, group string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.table == nil {
		return false
	}
	s, ok := r.table.shardOf(group)
	return ok && s == shard
}

// pick chooses the address for one attempt.
func (r *router) pick(ctx context.Context, t target, attempt int, avoid string) (string, error) {
	if r.c.opts.proxyOnly || t.anyNode {
		addrs := r.c.seeds
		if t.anyNode && !r.c.opts.proxyOnly {
			addrs = r.addresses()
		}
		start := int(r.rotate.Load())
		addr := addrs[(start+attempt)%len(addrs)]
		if addr == avoid && len(addrs) > 1 {
			addr = addrs[(start+attempt+1)%len(addrs)]
		}
		return addr, nil
	}
	if t.group == "" && t.shard == 0 {
		// A queue named "/q" (no group before its first slash): nothing
		// to route by, and no retry finds something.
		return "", fmt.Errorf("no consistency group to route by: a queue is named GROUP/NAME: %w", ErrInvalid)
	}
	tab, err := r.current(ctx)
	if err != nil {
		return "", err
	}
	shard := t.shard
	if t.group != "" {
		var ok bool
		if shard, ok = tab.shardOf(t.group); !ok {
			return "", errNoRoute
		}
	}
	addr, ok := r.route(shard, attempt, avoid)
	if !ok {
		r.markStale()
		return "", fmt.Errorf("shard %d has no known replica: %w", shard, errNoRoute)
	}
	return addr, nil
}

// failoverPause bounds the pause between attempts while a shard has no
// reachable leader (see call): a live replica answers such a poll at once,
// so it costs the cluster little, and a write waits at most about this long
// past the election.
const failoverPause = 200 * time.Millisecond

// pause sleeps for a random time up to *bound, then doubles the bound up to
// most. It returns false when ctx ends first.
func pause(ctx context.Context, bound *time.Duration, most time.Duration) bool {
	d := time.Duration(rand.Int64N(int64(*bound))) + 1
	*bound = min(*bound*2, most)
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// giveUp is the error of a call whose context ended before it succeeded. It
// matches the context's error and, when an attempt failed before, also
// ErrUnavailable and that attempt's error.
func giveUp(op string, t target, ctxErr, lastErr error, tried attempts) error {
	op = strings.ToLower(op)
	if lastErr == nil && len(tried) == 0 {
		return fmt.Errorf("%s (%s): %w", op, t, ctxErr)
	}
	if lastErr == nil {
		return &slowError{msg: fmt.Sprintf("%s (%s): %v: %v; %s", op, t, ErrUnavailable, ctxErr, tried), errs: []error{ErrUnavailable, ctxErr}, tried: tried}
	}
	return &slowError{msg: fmt.Sprintf("%s (%s): %v: %v; last error: %v; %s", op, t, ErrUnavailable, ctxErr, lastErr, tried),
		errs: []error{ErrUnavailable, ctxErr, lastErr}, tried: tried}
}

// attempts records what each attempt of a call met, so that a call that
// runs out of time can say what was slow: a node that could not be reached
// is a different problem (the address, the network) from one that was
// connected and did not answer in time (load; a longer --timeout).
type attempts []attempt

type attempt struct {
	addr      string
	took      time.Duration
	connected bool
	err       error
}

func (a *attempts) add(addr string, took time.Duration, connected bool, err error) {
	*a = append(*a, attempt{addr: addr, took: took, connected: connected, err: err})
}

// maxListed bounds the attempts an error message lists (the last ones).
const maxListed = 4

func (a attempts) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d attempt(s)", len(a))
	from := max(0, len(a)-maxListed)
	if from > 0 {
		fmt.Fprintf(&b, ", the last %d", maxListed)
	}
	b.WriteString(":")
	for i, at := range a[from:] {
		if i > 0 {
			b.WriteString(",")
		}
		took := at.took.Round(time.Millisecond)
		switch {
		case !at.connected && onlyTimedOut(at.err):
			fmt.Fprintf(&b, " %s not reached in %v", at.addr, took)
		case onlyTimedOut(at.err):
			fmt.Fprintf(&b, " %s connected, no answer in %v", at.addr, took)
		default:
			fmt.Fprintf(&b, " %s failed after %v (%s)", at.addr, took, status.Code(at.err))
		}
	}
	return b.String()
}

// Slow reports whether every attempt reached a node that then did not
// answer in time: the nodes are up but slow (overloaded, or waiting on
// their peers), and a longer timeout, not another address, is the cure.
func (a attempts) slow() bool {
	if len(a) == 0 {
		return false
	}
	for _, at := range a {
		if !at.connected || !onlyTimedOut(at.err) {
			return false
		}
	}
	return true
}

// slowError is a call that ran out of time, with what its attempts met.
type slowError struct {
	msg   string
	errs  []error
	tried attempts
}

func (e *slowError) Error() string   { return e.msg }
func (e *slowError) Unwrap() []error { return e.errs }

// ConnectedButSlow reports whether err is a call that ran out of time
// although every attempt reached a node: the nodes were slow to answer,
// not unreachable.
func ConnectedButSlow(err error) bool {
	var se *slowError
	return errors.As(err, &se) && se.tried.slow()
}

// onlyTimedOut reports whether err says no more than that a deadline passed
// or a call was cancelled. The caller's deadline can end an attempt (as
// gRPC's DeadlineExceeded) a moment before ctx.Err() reports it.
func onlyTimedOut(err error) bool {
	c := status.Code(err)
	return c == codes.Canceled || c == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded)
}

// shardOfTarget is the shard a target routes to, when the table knows it.
func (r *router) shardOfTarget(t target) (uint32, bool) {
	if t.anyNode {
		return 0, false
	}
	if t.group == "" {
		return t.shard, t.shard != 0
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.table == nil {
		return 0, false
	}
	return r.table.shardOf(t.group)
}

// minAttempt is the shortest attempt attemptTimeout gives.
const minAttempt = time.Second

// attemptTimeout bounds one attempt: the configured timeout, but at most
// half of what the caller's deadline leaves, so that an attempt stuck on a
// node that vanished without a word still leaves time to try another (a
// proxy in between would otherwise spend the whole deadline on it). A
// waiting claim (extra > 0) keeps its full wait.
func attemptTimeout(ctx context.Context, base, extra time.Duration) time.Duration {
	if extra > 0 {
		return base + extra
	}
	if dl, ok := ctx.Deadline(); ok {
		if half := time.Until(dl) / 2; half < base {
			return max(half, minAttempt)
		}
	}
	return base
}
