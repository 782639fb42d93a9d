package fsm

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

// Errors returned (wrapped in a *ValidationError) by Validate. Check them
// with errors.Is: ErrTooLarge maps to ResourceExhausted, ErrInvalid to
// InvalidArgument.
var (
	// ErrInvalid: a field breaks a shape rule (required, name, group, range).
	ErrInvalid = errors.New("invalid argument")
	// ErrTooLarge: a value, an error text, or the number of operations is
	// over its limit.
	ErrTooLarge = errors.New("over a limit")
)

// ValidationError says which field of a command broke which rule. It wraps
// ErrInvalid or ErrTooLarge.
type ValidationError struct {
	Field string // path in the command, e.g. "inserts[3].value"
	Rule  string
	Kind  error // ErrInvalid or ErrTooLarge
}

func (e *ValidationError) Error() string { return e.Field + ": " + e.Rule }
func (e *ValidationError) Unwrap() error { return e.Kind }

func invalidf(field, format string, args ...any) error {
	return &ValidationError{Field: field, Rule: fmt.Sprintf(format, args...), Kind: ErrInvalid}
}

// ValidateHeaders checks a task's headers against MaxHeaders,
// MaxHeaderBytes and MaxHeaderKeyBytes: keys non-empty, values non-empty
// (an empty value would be indistinguishable from an absent key over
// HTTP), both valid UTF-8. The error is a *ValidationError wrapping
// ErrInvalid; keys are named in sorted order, so the answer is stable.
func ValidateHeaders(field string, h map[string]string) error {
	if len(h) > MaxHeaders {
		return invalidf(field, "%d headers exceed the limit of %d", len(h), MaxHeaders)
	}
	keys := make([]string, 0, len(h))
	total := 0
	for k, val := range h {
		keys = append(keys, k)
		total += len(k) + len(val)
	}
	slices.Sort(keys)
	for _, k := range keys {
		val := h[k]
		switch {
		case k == "":
			return invalidf(field, "a header key must not be empty")
		case len(k) > MaxHeaderKeyBytes:
			return invalidf(field, "header key %.32q...: %d bytes exceeds the limit of %d", k, len(k), MaxHeaderKeyBytes)
		case val == "":
			return invalidf(field, "header %q has an empty value", k)
		case !utf8.ValidString(k) || !utf8.ValidString(val):
			return invalidf(field, "header %q is not valid UTF-8", k)
		}
	}
	if total > MaxHeaderBytes {
		return invalidf(field, "headers take %d bytes (keys and values), over the limit of %d", total, MaxHeaderBytes)
	}
	return nil
}

func tooLarge(field string, n, limit int) error {
	return &ValidationError{Field: field, Rule: fmt.Sprintf("%d bytes exceeds the limit of %d", n, limit), Kind: ErrTooLarge}
}

// Validate checks a command against limits and shape rules (names, one group,
// durations, sizes) before it is proposed. Errors name the field and the rule.
//
// Zero fields of limits take DefaultLimits. The error is a *ValidationError
// wrapping ErrInvalid or ErrTooLarge. Ids must already be filled in (the
// leader chooses missing ones before validating). Validate does not look at
// Command.now, which the leader stamps afterwards.
func Validate(cmd *fsmpb.Command, limits Limits) error {
	v := validator{l: limits.WithDefaults()}
	if cmd == nil {
		return invalidf("command", "required")
	}
	return v.command(cmd, "", true)
}

// maxScope bounds Modify.scope (a token's queue prefixes).
const maxScope = 64

type validator struct{ l Limits }

// name checks a queue name, key, claimant or client id.
func (v *validator) name(field, s string, required bool) error {
	switch {
	case s == "":
		if required {
			return invalidf(field, "required")
		}
	case len(s) > v.l.MaxNameBytes:
		return invalidf(field, "%d bytes exceeds the limit of %d", len(s), v.l.MaxNameBytes)
	case !utf8.ValidString(s):
		return invalidf(field, "not valid UTF-8")
	}
	return nil
}

func (v *validator) queue(field, s, group string) error {
	if err := v.name(field, s, true); err != nil {
		return err
	}
	if err := taskstorepb.CheckQueue(s); err != nil {
		return invalidf(field, "%v", err)
	}
	if group != "" && groupOf(s) != group {
		return invalidf(field, "queue %q is not in consistency group %q", s, group)
	}
	return nil
}

// newQueue checks a queue that the command puts tasks in.
func (v *validator) newQueue(field, s, group string) error {
	if err := v.queue(field, s, group); err != nil {
		return err
	}
	if err := taskstorepb.CheckNewQueue(s); err != nil {
		return invalidf(field, "%v", err)
	}
	return nil
}

func (v *validator) id(field, s string) error {
	switch {
	case s == "":
		return invalidf(field, "required")
	case len(s) > v.l.MaxIDBytes:
		return invalidf(field, "%d bytes exceeds the limit of %d", len(s), v.l.MaxIDBytes)
	case !utf8.ValidString(s):
		return invalidf(field, "not valid UTF-8")
	}
	return nil
}

// commandBodies names a command's bodies in the order they are checked,
// and the op each belongs to (an OP_MODIFY_CLAIM's body is its modify).
var commandBodies = []struct {
	name string
	ops  []fsmpb.Op
	set  func(*fsmpb.Command) bool
}{
	{"modify", []fsmpb.Op{fsmpb.Op_OP_MODIFY, fsmpb.Op_OP_MODIFY_CLAIM}, func(c *fsmpb.Command) bool { return c.Modify != nil }},
	{"claim", []fsmpb.Op{fsmpb.Op_OP_CLAIM}, func(c *fsmpb.Command) bool { return c.Claim != nil }},
	{"purge", []fsmpb.Op{fsmpb.Op_OP_PURGE}, func(c *fsmpb.Command) bool { return c.Purge != nil }},
	{"pause", []fsmpb.Op{fsmpb.Op_OP_PAUSE}, func(c *fsmpb.Command) bool { return c.Pause != nil }},
	{"limit", []fsmpb.Op{fsmpb.Op_OP_LIMIT}, func(c *fsmpb.Command) bool { return c.Limit != nil }},
	{"schedule", []fsmpb.Op{fsmpb.Op_OP_SCHEDULE}, func(c *fsmpb.Command) bool { return c.Schedule != nil }},
	{"policy", []fsmpb.Op{fsmpb.Op_OP_POLICY}, func(c *fsmpb.Command) bool { return c.Policy != nil }},
	{"expire", []fsmpb.Op{fsmpb.Op_OP_EXPIRE}, func(c *fsmpb.Command) bool { return c.Expire != nil }},
	{"batch", []fsmpb.Op{fsmpb.Op_OP_BATCH}, func(c *fsmpb.Command) bool { return len(c.Batch) > 0 }},
}

// bodies checks that cmd carries its op's body and no other. It runs for
// every request a node takes, so it allocates nothing unless it fails.
func (v *validator) bodies(cmd *fsmpb.Command, path string) error {
	for _, b := range commandBodies {
		want, set := slices.Contains(b.ops, cmd.Op), b.set(cmd)
		if want && !set {
			return invalidf(path+b.name, "required for %v", cmd.Op)
		}
		if !want && set {
			return invalidf(path+b.name, "must be empty for %v", cmd.Op)
		}
	}
	return nil
}

func (v *validator) command(cmd *fsmpb.Command, path string, top bool) error {
	if err := v.name(path+"client_id", cmd.ClientId, false); err != nil {
		return err
	}
	switch cmd.Op {
	case fsmpb.Op_OP_MODIFY, fsmpb.Op_OP_MODIFY_CLAIM, fsmpb.Op_OP_CLAIM, fsmpb.Op_OP_PURGE, fsmpb.Op_OP_PAUSE, fsmpb.Op_OP_LIMIT, fsmpb.Op_OP_SCHEDULE, fsmpb.Op_OP_POLICY, fsmpb.Op_OP_EXPIRE, fsmpb.Op_OP_TICK:
	case fsmpb.Op_OP_BATCH:
		if !top {
			return invalidf(path+"op", "a batch may not contain a batch")
		}
	default:
		return invalidf(path+"op", "unknown op %d", int32(cmd.Op))
	}
	if err := v.bodies(cmd, path); err != nil {
		return err
	}
	switch cmd.Op {
	case fsmpb.Op_OP_MODIFY, fsmpb.Op_OP_MODIFY_CLAIM:
		// The op tells older binaries that a claim rides along: it and the
		// claim part go together.
		switch withClaim := cmd.Op == fsmpb.Op_OP_MODIFY_CLAIM; {
		case withClaim && cmd.Modify.Claim == nil:
			return invalidf(path+"modify.claim", "required for %v", cmd.Op)
		case !withClaim && cmd.Modify.Claim != nil:
			return invalidf(path+"modify.claim", "needs %v", fsmpb.Op_OP_MODIFY_CLAIM)
		}
		return v.modify(cmd.Modify, path)
	case fsmpb.Op_OP_CLAIM:
		return v.claim(cmd.Claim, path)
	case fsmpb.Op_OP_PURGE:
		return v.queue(path+"purge.queue", cmd.Purge.Queue, "")
	case fsmpb.Op_OP_PAUSE:
		return v.queue(path+"pause.queue", cmd.Pause.Queue, "")
	case fsmpb.Op_OP_LIMIT:
		return v.queue(path+"limit.queue", cmd.Limit.Queue, "")
	case fsmpb.Op_OP_SCHEDULE:
		return v.schedule(cmd.Schedule, path+"schedule.")
	case fsmpb.Op_OP_POLICY:
		p := cmd.Policy
		if err := v.queue(path+"policy.queue", p.Queue, ""); err != nil {
			return err
		}
		if p.DeadLetter != "" {
			if err := v.queue(path+"policy.dead_letter", p.DeadLetter, ""); err != nil {
				return err
			}
		}
		if f := checkPolicy(p); f != nil {
			return invalidf(path+"policy", "%s", f.Failure.Message)
		}
	case fsmpb.Op_OP_EXPIRE:
		return v.queue(path+"expire.queue", cmd.Expire.Queue, "")
	case fsmpb.Op_OP_BATCH:
		if len(cmd.Batch) > v.l.MaxOps {
			return &ValidationError{Field: path + "batch", Rule: fmt.Sprintf("%d commands exceeds the limit of %d", len(cmd.Batch), v.l.MaxOps), Kind: ErrTooLarge}
		}
		for i, sub := range cmd.Batch {
			if sub == nil {
				return invalidf(fmt.Sprintf("%sbatch[%d]", path, i), "required")
			}
			if err := v.command(sub, fmt.Sprintf("%sbatch[%d].", path, i), false); err != nil {
				return err
			}
		}
	}
	return nil
}

// MaxScheduleEvery bounds a schedule's interval (package schedule's
// MaxEvery): ticks far beyond would overflow the clock.
const MaxScheduleEvery = int64(10 * 365 * 24 * time.Hour)

// MaxScheduleNameBytes bounds a schedule's name, so that the ids of the
// tasks it inserts (name@time) fit MaxIDBytes.
const MaxScheduleNameBytes = 64

func (v *validator) schedule(s *fsmpb.Schedule, path string) error {
	check := v.newQueue
	if s.Remove {
		check = v.queue
	}
	if err := check(path+"queue", s.Queue, ""); err != nil {
		return err
	}
	if err := v.name(path+"name", s.Name, true); err != nil {
		return err
	}
	if len(s.Name) > MaxScheduleNameBytes {
		return tooLarge(path+"name", len(s.Name), MaxScheduleNameBytes)
	}
	if strings.ContainsAny(s.Name, "@/") {
		return invalidf(path+"name", "must not contain '@' or '/'")
	}
	if s.Remove {
		return nil
	}
	if (s.Cron == "") == (s.Every <= 0) {
		return invalidf(path+"cron", "give a cron expression or an interval, one of them")
	}
	if s.Every > MaxScheduleEvery {
		return invalidf(path+"every", "at most %v", time.Duration(MaxScheduleEvery))
	}
	if len(s.Value) > v.l.MaxValueBytes {
		return tooLarge(path+"value", len(s.Value), v.l.MaxValueBytes)
	}
	return nil
}

func (v *validator) modify(m *fsmpb.Modify, path string) error {
	if err := v.name(path+"group", m.Group, true); err != nil {
		return err
	}
	if groupOf(m.Group) != m.Group {
		return invalidf(path+"group", "%q is not a group name (it contains '/')", m.Group)
	}
	for i, in := range m.Inserts {
		if in.Held && m.Claimant == "" {
			return invalidf(fmt.Sprintf("%sinserts[%d].held", path, i), "needs the request's claimant: the task is held by it")
		}
	}
	if err := v.name(path+"claimant", m.Claimant, false); err != nil {
		return err
	}
	// The scope comes from the caller's token (a handful of prefixes), not
	// from the request; bound it anyway, as everything that reaches the log.
	if len(m.Scope) > maxScope {
		return invalidf(path+"scope", "%d prefixes exceeds the limit of %d", len(m.Scope), maxScope)
	}
	for i, p := range m.Scope {
		if err := v.name("", p, true); err != nil {
			return within(err, fmt.Sprintf("%sscope[%d]", path, i))
		}
	}
	ops := len(m.Inserts) + len(m.Changes) + len(m.Deletes) + len(m.Depends)
	if ops == 0 && m.Claim == nil {
		return invalidf(path+"modify", "empty transaction")
	}
	if c := m.Claim; c != nil {
		// The same rules as a Claim's, and the claim stays in the
		// transaction's group and is the modifier's.
		if err := v.claim(c, ""); err != nil {
			return within(err, path+"claim.")
		}
		if c.Claimant != m.Claimant {
			return invalidf(path+"claim.claimant", "%q differs from the modify's claimant %q", c.Claimant, m.Claimant)
		}
		for i, q := range c.Queues {
			if groupOf(q) != m.Group {
				return invalidf(fmt.Sprintf("%sclaim.queues[%d]", path, i), "queue %q is not in consistency group %q", q, m.Group)
			}
		}
	}
	if ops > v.l.MaxOps {
		return &ValidationError{Field: path + "modify", Rule: fmt.Sprintf("%d operations exceeds the limit of %d", ops, v.l.MaxOps), Kind: ErrTooLarge}
	}
	// The checks of a list's elements name fields relative to the element
	// (within adds the path when one fails), so that a valid command
	// builds no field names: every write a node takes passes here.
	var ids idSet
	for i, in := range m.Inserts {
		if err := v.insert(in, m.Group, path, &ids, i); err != nil {
			return within(err, elementPath(path, "inserts", i))
		}
	}
	for i, c := range m.Changes {
		if err := v.change(c, m.Group, path, &ids, i); err != nil {
			return within(err, elementPath(path, "changes", i))
		}
	}
	for i, r := range m.Deletes {
		if err := v.ref(r.Id, r.Version); err != nil {
			return within(err, elementPath(path, "deletes", i))
		}
		if err := ids.add(r.Id, path, "deletes", i); err != nil {
			return within(err, elementPath(path, "deletes", i))
		}
	}
	for i, r := range m.Depends {
		if err := v.ref(r.Id, r.Version); err != nil {
			return within(err, elementPath(path, "depends", i))
		}
	}
	return nil
}

func (v *validator) insert(in *fsmpb.Insert, group, path string, ids *idSet, i int) error {
	if err := v.id("id", in.Id); err != nil {
		return err
	}
	if err := ids.add(in.Id, path, "inserts", i); err != nil {
		return err
	}
	if err := v.newQueue("queue", in.Queue, group); err != nil {
		return err
	}
	if in.At < 0 {
		return invalidf("at", "must not be negative")
	}
	if err := v.name("key", in.Key, false); err != nil {
		return err
	}
	if in.IfAbsent && in.Key == "" {
		return invalidf("if_absent", "needs a key")
	}
	switch {
	case in.DedupWindow < 0 || in.DedupWindow > MaxDedupWindow:
		return invalidf("dedup_window", "must be between 0 and %v", time.Duration(MaxDedupWindow))
	case in.DedupWindow > 0 && in.Key == "":
		return invalidf("dedup_window", "needs a key: the window keeps the key reserved")
	}
	if len(in.Value) > v.l.MaxValueBytes {
		return tooLarge("value", len(in.Value), v.l.MaxValueBytes)
	}
	if len(in.Err) > v.l.MaxErrBytes {
		return tooLarge("err", len(in.Err), v.l.MaxErrBytes)
	}
	return ValidateHeaders("headers", in.Headers)
}

func (v *validator) change(c *fsmpb.Change, group, path string, ids *idSet, i int) error {
	if err := v.ref(c.Id, c.Version); err != nil {
		return err
	}
	if err := ids.add(c.Id, path, "changes", i); err != nil {
		return err
	}
	if c.Queue != "" {
		if err := v.newQueue("queue", c.Queue, group); err != nil {
			return err
		}
	}
	if c.At < 0 {
		return invalidf("at", "must not be negative")
	}
	if len(c.Value) > v.l.MaxValueBytes {
		return tooLarge("value", len(c.Value), v.l.MaxValueBytes)
	}
	if c.Err != nil && len(*c.Err) > v.l.MaxErrBytes {
		return tooLarge("err", len(*c.Err), v.l.MaxErrBytes)
	}
	if err := ValidateHeaders("headers", c.Headers); err != nil {
		return err
	}
	if c.ClearHeaders && len(c.Headers) > 0 {
		return invalidf("clear_headers", "headers replace the task's: give one or the other")
	}
	return nil
}

// elementPath is the path of a list's element: "inserts[3].".
func elementPath(path, list string, i int) string {
	return fmt.Sprintf("%s%s[%d].", path, list, i)
}

// within puts a *ValidationError's field under prefix.
func within(err error, prefix string) error {
	if ve, ok := err.(*ValidationError); ok {
		return &ValidationError{Field: prefix + ve.Field, Rule: ve.Rule, Kind: ve.Kind}
	}
	return err
}

// idSet is the task ids a modify has named so far, for the check that no
// task is named twice: a scan of an array while they are few (no
// allocation), a map once there are more.
type idSet struct {
	few  [8]namedID
	n    int
	many map[string]namedID
}

// namedID is where a modify named an id: the element i of list.
type namedID struct {
	id, list string
	i        int
}

// add records id as named by element i of list, or fails, naming the
// element that named it before.
func (s *idSet) add(id, path, list string, i int) error {
	prev, dup := s.find(id)
	if dup {
		return invalidf("id", "task %q is also named by %s%s[%d].id", id, path, prev.list, prev.i)
	}
	n := namedID{id: id, list: list, i: i}
	switch {
	case s.many != nil:
		s.many[id] = n
	case s.n < len(s.few):
		s.few[s.n] = n
		s.n++
	default:
		s.many = make(map[string]namedID, 2*len(s.few))
		for _, f := range s.few {
			s.many[f.id] = f
		}
		s.many[id] = n
	}
	return nil
}

func (s *idSet) find(id string) (namedID, bool) {
	if s.many != nil {
		n, ok := s.many[id]
		return n, ok
	}
	for _, n := range s.few[:s.n] {
		if n.id == id {
			return n, true
		}
	}
	return namedID{}, false
}

// ref checks a task named by id and version, its fields named relative
// to the element that names it.
func (v *validator) ref(id string, version uint64) error {
	if err := v.id("id", id); err != nil {
		return err
	}
	if version == 0 {
		return invalidf("version", "required (versions start at 1)")
	}
	return nil
}

func (v *validator) claim(c *fsmpb.Claim, path string) error {
	if err := v.name(path+"claimant", c.Claimant, true); err != nil {
		return err
	}
	if len(c.Queues) == 0 {
		return invalidf(path+"queues", "name at least one queue")
	}
	group := ""
	for i, q := range c.Queues {
		if err := v.queue("", q, group); err != nil {
			return within(err, fmt.Sprintf("%squeues[%d]", path, i))
		}
		group = groupOf(q)
	}
	if c.Lease <= 0 || c.Lease > v.l.MaxLeaseNanos {
		return invalidf(path+"lease", "%v is outside (0s, %v]", time.Duration(c.Lease), time.Duration(v.l.MaxLeaseNanos))
	}
	if c.Limit < 1 || int(c.Limit) > v.l.MaxClaimLimit {
		return invalidf(path+"limit", "%d is outside [1, %d]", c.Limit, v.l.MaxClaimLimit)
	}
	return nil
}
