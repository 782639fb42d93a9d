package cluster

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// hclogAdapter sends hashicorp/raft's and memberlist's hclog output to slog.
type hclogAdapter struct {
	hclog.Logger // a null logger for the methods we do not need
	log          *slog.Logger
	name         string
	args         []interface{}
	min          slog.Level
	repeats      *repeatLimiter // shared by every logger derived from one
}

// newHCLog returns an hclog.Logger that writes to l at min level and above.
func newHCLog(l *slog.Logger, min slog.Level) hclog.Logger {
	return &hclogAdapter{Logger: hclog.NewNullLogger(), log: l, min: min, repeats: newRepeatLimiter(repeatEvery, time.Now)}
}

// repeatEvery is how often a peer's same connection failure logs at WARN;
// the repeats in between log at DEBUG. A peer that is down fails every
// heartbeat and append of every group (~200 WARN lines in the 10 s a dev
// node was down); one line per peer and kind every half minute says the
// same, and the under-replicated shard says it too.
const repeatEvery = 30 * time.Second

// repeatLimited are raft's messages of a peer's connection failures, and
// the key that names the peer in each.
var repeatLimited = map[string]string{
	"failed to appendEntries to":              "peer",
	"failed to heartbeat to":                  "peer",
	"failed to pipeline appendEntries":        "peer",
	"failed to make requestVote RPC":          "target",
	"failed to contact":                       "server-id",
	"failed to start pipeline replication to": "peer",
}

// repeatLimiter remembers when each (message, peer) last logged at WARN
// and how many repeats it has held back since.
type repeatLimiter struct {
	every time.Duration
	now   func() time.Time
	mu    sync.Mutex
	last  map[string]repeatState
}

type repeatState struct {
	at         time.Time
	suppressed int
}

func newRepeatLimiter(every time.Duration, now func() time.Time) *repeatLimiter {
	return &repeatLimiter{every: every, now: now, last: map[string]repeatState{}}
}

// allow reports whether key may log at its level now, and how many repeats
// were held back since it last did.
func (r *repeatLimiter) allow(key string) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	st, seen := r.last[key]
	if seen && now.Sub(st.at) < r.every {
		st.suppressed++
		r.last[key] = st
		return false, 0
	}
	if len(r.last) > 1024 { // peers come and go: forget the old ones
		for k, v := range r.last {
			if now.Sub(v.at) >= r.every {
				delete(r.last, k)
			}
		}
	}
	r.last[key] = repeatState{at: now}
	return true, st.suppressed
}

// repeatKey is the limiter's key of a limited message, "" for others; raft
// names the peer in the call's own arguments.
func repeatKey(msg string, args []interface{}) string {
	name, ok := repeatLimited[msg]
	if !ok {
		return ""
	}
	for i := 0; i+1 < len(args); i += 2 {
		if k, _ := args[i].(string); k == name {
			return msg + "\x00" + fmt.Sprint(args[i+1])
		}
	}
	return msg
}

// raftLevels re-levels what hashicorp/raft reports of normal events: an
// election on a fresh start or after a leader change, replication handing
// over to a newer term, and the connection errors of a peer that restarts
// or leaves in a planned change. They said WARN and ERROR, which tell an
// operator to act; a peer that stays unreachable shows as an
// under-replicated shard and a leader-less group instead, and its
// failures still log at WARN.
var raftLevels = map[string]slog.Level{
	"heartbeat timeout reached, starting election": slog.LevelInfo,
	"peer has newer term, stopping replication":    slog.LevelInfo,
	// A split vote: many groups electing at once (a fresh start, a node
	// with many leaderships lost) often need a second round. A group that
	// stays leaderless shows as NO-LEADER in status and in the alerts.
	"Election timeout reached, restarting election": slog.LevelInfo,
	// A started node waits, with no configuration, to be added (node add):
	// its meta group times out and finds nobody to ask, as it should.
	"no known peers, aborting election": slog.LevelInfo,
	"failed to decode incoming command": slog.LevelWarn,
	// The peer that asked closed the connection before the answer went
	// out: it stopped, restarted or was cut off (TestClusterStopLogsNoAlarm
	// caught one in a whole-cluster stop).
	"failed to flush response":                slog.LevelWarn,
	"failed to appendEntries to":              slog.LevelWarn,
	"failed to heartbeat to":                  slog.LevelWarn,
	"failed to pipeline appendEntries":        slog.LevelWarn,
	"failed to make requestVote RPC":          slog.LevelWarn,
	"failed to contact":                       slog.LevelWarn,
	"failed to start pipeline replication to": slog.LevelWarn,
	// A follower catching up (a new or restarted replica): the leader
	// walks back to where their logs agree. Normal in node add.
	"failed to get previous log":                 slog.LevelInfo,
	"appendEntries rejected, sending older logs": slog.LevelInfo,
	"previous log term mis-match":                slog.LevelInfo,
}

// reservedKeys are the keys slog's own attributes and the node's use.
var reservedKeys = map[string]bool{"time": true, "level": true, "msg": true, "node": true, "component": true, "shard": true, "group": true}

func (a *hclogAdapter) emit(level slog.Level, msg string, args ...interface{}) {
	if l, ok := raftLevels[msg]; ok && l < level {
		level = l
	}
	held := 0
	if key := repeatKey(msg, args); key != "" && level >= slog.LevelWarn && a.repeats != nil {
		var ok bool
		if ok, held = a.repeats.allow(key); !ok {
			level = slog.LevelDebug
		}
	}
	// Below the level nothing is built: raft logs at DEBUG on its hot paths.
	if level < a.min || !a.log.Enabled(context.Background(), level) {
		return
	}
	all := append(append([]interface{}{}, a.args...), args...)
	if held > 0 {
		all = append(all, "repeats_not_shown", held)
	}
	for i := 0; i+1 < len(all); i += 2 {
		// raft's "failed to contact" says time=1s: a second time= in the
		// line, which log readers take for the timestamp.
		if k, ok := all[i].(string); ok && reservedKeys[k] {
			all[i] = "raft_" + k
		}
	}
	if a.name != "" {
		all = append(all, "lib", a.name)
	}
	a.log.Log(context.Background(), level, msg, all...)
}

func (a *hclogAdapter) Log(level hclog.Level, msg string, args ...interface{}) {
	switch level {
	case hclog.Trace, hclog.Debug:
		a.emit(slog.LevelDebug, msg, args...)
	case hclog.Warn:
		a.emit(slog.LevelWarn, msg, args...)
	case hclog.Error:
		a.emit(slog.LevelError, msg, args...)
	default:
		a.emit(slog.LevelInfo, msg, args...)
	}
}
func (a *hclogAdapter) Trace(msg string, args ...interface{}) {
	a.emit(slog.LevelDebug-4, msg, args...)
}
func (a *hclogAdapter) Debug(msg string, args ...interface{}) { a.emit(slog.LevelDebug, msg, args...) }
func (a *hclogAdapter) Info(msg string, args ...interface{})  { a.emit(slog.LevelInfo, msg, args...) }
func (a *hclogAdapter) Warn(msg string, args ...interface{})  { a.emit(slog.LevelWarn, msg, args...) }
func (a *hclogAdapter) Error(msg string, args ...interface{}) { a.emit(slog.LevelError, msg, args...) }
func (a *hclogAdapter) IsTrace() bool                         { return false }
func (a *hclogAdapter) IsDebug() bool                         { return a.min <= slog.LevelDebug }
func (a *hclogAdapter) IsInfo() bool                          { return a.min <= slog.LevelInfo }
func (a *hclogAdapter) IsWarn() bool                          { return a.min <= slog.LevelWarn }
func (a *hclogAdapter) IsError() bool                         { return true }
func (a *hclogAdapter) ImpliedArgs() []interface{}            { return a.args }
func (a *hclogAdapter) Name() string                          { return a.name }

func (a *hclogAdapter) With(args ...interface{}) hclog.Logger {
	c := *a
	c.args = append(append([]interface{}{}, a.args...), args...)
	return &c
}

func (a *hclogAdapter) Named(name string) hclog.Logger {
	c := *a
	if c.name != "" {
		name = c.name + "." + name
	}
	c.name = name
	return &c
}

func (a *hclogAdapter) ResetNamed(name string) hclog.Logger {
	c := *a
	c.name = name
	return &c
}

func (a *hclogAdapter) StandardLogger(*hclog.StandardLoggerOptions) *log.Logger {
	return slog.NewLogLogger(a.log.Handler(), a.min)
}

func (a *hclogAdapter) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return slog.NewLogLogger(a.log.Handler(), a.min).Writer()
}

// stopQuiet logs everything below ERROR at DEBUG while its node stops.
type stopQuiet struct {
	slog.Handler
	stopping *atomic.Bool
}

func (h stopQuiet) level(l slog.Level) slog.Level {
	if h.stopping.Load() && l < slog.LevelError {
		return min(l, slog.LevelDebug)
	}
	return l
}

func (h stopQuiet) Enabled(ctx context.Context, l slog.Level) bool {
	return h.Handler.Enabled(ctx, h.level(l))
}

func (h stopQuiet) Handle(ctx context.Context, r slog.Record) error {
	if l := h.level(r.Level); l != r.Level {
		if !h.Handler.Enabled(ctx, l) {
			return nil
		}
		r.Level = l
	}
	return h.Handler.Handle(ctx, r)
}

func (h stopQuiet) WithAttrs(as []slog.Attr) slog.Handler {
	return stopQuiet{Handler: h.Handler.WithAttrs(as), stopping: h.stopping}
}

func (h stopQuiet) WithGroup(name string) slog.Handler {
	return stopQuiet{Handler: h.Handler.WithGroup(name), stopping: h.stopping}
}
