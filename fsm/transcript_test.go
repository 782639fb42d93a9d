package fsm

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/e1158ecb/taskstore/fsm/fsmpb"
)

var update = flag.Bool("update", false, "rewrite the golden transcripts in testdata/")

// TestTranscript replays testdata/*.txt. Each file is a series of cases: a
// command line, optional body lines, a "----" line, and the exact expected
// output up to a blank line. Lines starting with # between cases are
// comments. `go test ./fsm -run Transcript -update` rewrites the outputs;
// review the diff.
//
// Commands (times are plain integers, in nanoseconds):
//
//	tick now=N
//	modify [now=N] [group=G] [claimant=C] [client=ID seq=N]
//	  insert id=I queue=Q [at=N] [prio=N] [key=K] [value=V] [attempt=N] [err=E] [if_absent]
//	  change id=I v=N [queue=Q] [at=N] [value=V] [prio=N] [attempt=N] [err=E] [keep_claim]
//	  delete id=I v=N
//	  depend id=I v=N
//	  claimnext queues=Q1,Q2 lease=N [limit=N]   (the claim part: OP_MODIFY_CLAIM)
//	claim [now=N] claimant=C queues=Q1,Q2 lease=N [limit=N] [client=ID seq=N]
//	purge [now=N] queue=Q [client=ID seq=N]
//	batch [now=N] [client=ID seq=N]   (body: one of the commands above per line, modify ops after their modify)
//	state                              clock and every task, by id
//	get ID...
//	list queue=Q [limit=N] [claimed=true|false] [omit_values]   every page
//	queues [prefix=P] [limit=N]
//	nextat queues=Q1,Q2
//	restore                            snapshot, restore into a new machine, compare digests, continue on it
func TestTranscript(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no transcripts: %v", err)
	}
	for _, path := range files {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			runTranscript(t, path, memMachine)
		})
		if *update {
			continue
		}
		// The same transcript, the same answers, on the on-disk store.
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt")+"/ondisk", func(t *testing.T) {
			runTranscript(t, path, diskMachine)
		})
	}
}

type transcriptCase struct {
	line   int
	input  []string // command line and body
	output []string
}

func runTranscript(t *testing.T, path string, newMachine func(testing.TB, Options) *Machine) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var out bytes.Buffer
	tr := newTranscriptRunner(t, newMachine)
	for i := 0; i < len(lines); {
		l := lines[i]
		if strings.TrimSpace(l) == "" || strings.HasPrefix(l, "#") {
			out.WriteString(l + "\n")
			i++
			continue
		}
		c := transcriptCase{line: i + 1}
		for i < len(lines) && lines[i] != "----" {
			c.input = append(c.input, lines[i])
			i++
		}
		if i == len(lines) {
			t.Fatalf("%s:%d: case without ----", path, c.line)
		}
		i++
		for i < len(lines) && strings.TrimSpace(lines[i]) != "" {
			c.output = append(c.output, lines[i])
			i++
		}
		got := tr.run(c.input)
		if !*update && strings.Join(got, "\n") != strings.Join(c.output, "\n") {
			t.Errorf("%s:%d: %s\ngot:\n%s\nwant:\n%s", path, c.line, c.input[0], strings.Join(got, "\n"), strings.Join(c.output, "\n"))
		}
		for _, l := range c.input {
			out.WriteString(l + "\n")
		}
		out.WriteString("----\n")
		for _, l := range got {
			out.WriteString(l + "\n")
		}
	}
	if *update {
		if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

type transcriptRunner struct {
	t        *testing.T
	new      func(testing.TB, Options) *Machine
	m        *Machine
	index    uint64
	notified []string
}

func newTranscriptRunner(t *testing.T, newMachine func(testing.TB, Options) *Machine) *transcriptRunner {
	tr := &transcriptRunner{t: t, new: newMachine}
	tr.m = newMachine(t, tr.options())
	return tr
}

func (tr *transcriptRunner) options() Options {
	return Options{
		OnAvailable: func(qs []string) { tr.notified = append(tr.notified, qs...) },
		MaxSessions: 3,
		SessionTTL:  1000,
	}
}

// args parses "k=v k2="quoted v" flag" into a map; flags map to "".
func parseArgs(s string) (string, map[string]string, error) {
	s = strings.TrimSpace(s)
	name, rest, _ := strings.Cut(s, " ")
	args := map[string]string{}
	rest = strings.TrimSpace(rest)
	for rest != "" {
		end := strings.IndexAny(rest, " =")
		if end < 0 {
			args[rest] = ""
			break
		}
		k := rest[:end]
		if rest[end] == ' ' {
			args[k] = ""
			rest = strings.TrimSpace(rest[end:])
			continue
		}
		rest = rest[end+1:]
		var v string
		if strings.HasPrefix(rest, `"`) {
			q, err := strconv.QuotedPrefix(rest)
			if err != nil {
				return "", nil, fmt.Errorf("bad quoted value for %s: %v", k, err)
			}
			v, _ = strconv.Unquote(q)
			rest = rest[len(q):]
		} else {
			v, rest, _ = strings.Cut(rest, " ")
		}
		args[k] = v
		rest = strings.TrimSpace(rest)
	}
	return name, args, nil
}

type argReader struct {
	args map[string]string
	err  error
}

func (a *argReader) str(k string) string { v := a.args[k]; delete(a.args, k); return v }
func (a *argReader) has(k string) bool   { _, ok := a.args[k]; delete(a.args, k); return ok }
func (a *argReader) int(k string) int64 {
	v, ok := a.args[k]
	delete(a.args, k)
	if !ok {
		return 0
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil && a.err == nil {
		a.err = fmt.Errorf("%s: %v", k, err)
	}
	return n
}
func (a *argReader) done() error {
	if a.err != nil {
		return a.err
	}
	for k := range a.args {
		return fmt.Errorf("unknown argument %q", k)
	}
	return nil
}

// parseCommand builds a command from a command line and the body lines that
// belong to it; it returns how many body lines it used.
func parseCommand(line string, body []string) (*fsmpb.Command, int, error) {
	name, args, err := parseArgs(line)
	if err != nil {
		return nil, 0, err
	}
	a := &argReader{args: args}
	cmd := &fsmpb.Command{Now: a.int("now"), ClientId: a.str("client"), Seq: uint64(a.int("seq"))}
	used := 0
	switch name {
	case "tick":
		cmd.Op = fsmpb.Op_OP_TICK
	case "purge":
		cmd.Op = fsmpb.Op_OP_PURGE
		cmd.Purge = &fsmpb.Purge{Queue: a.str("queue")}
	case "claim":
		cmd.Op = fsmpb.Op_OP_CLAIM
		cmd.Claim = &fsmpb.Claim{Claimant: a.str("claimant"), Queues: strings.Split(a.str("queues"), ","),
			Lease: a.int("lease"), Limit: uint32(a.int("limit"))}
		if cmd.Claim.Limit == 0 {
			cmd.Claim.Limit = 1
		}
	case "modify":
		cmd.Op = fsmpb.Op_OP_MODIFY
		m := &fsmpb.Modify{Group: a.str("group"), Claimant: a.str("claimant")}
		cmd.Modify = m
	ops:
		for used < len(body) {
			opName, opArgs, err := parseArgs(body[used])
			if err != nil {
				return nil, 0, err
			}
			o := &argReader{args: opArgs}
			switch opName {
			case "insert":
				in := &fsmpb.Insert{Id: o.str("id"), Queue: o.str("queue"), At: o.int("at"), Priority: int32(o.int("prio")),
					Key: o.str("key"), Attempt: uint32(o.int("attempt")), Err: o.str("err"), IfAbsent: o.has("if_absent")}
				if v, ok := o.args["value"]; ok {
					in.Value = []byte(v)
					delete(o.args, "value")
				}
				m.Inserts = append(m.Inserts, in)
			case "change":
				c := &fsmpb.Change{Id: o.str("id"), Version: uint64(o.int("v")), Queue: o.str("queue"), At: o.int("at"),
					KeepClaim: o.has("keep_claim")}
				if v, ok := o.args["value"]; ok {
					c.Value = []byte(v)
					delete(o.args, "value")
				}
				if _, ok := o.args["prio"]; ok {
					p := int32(o.int("prio"))
					c.Priority = &p
				}
				if _, ok := o.args["attempt"]; ok {
					n := uint32(o.int("attempt"))
					c.Attempt = &n
				}
				if v, ok := o.args["err"]; ok {
					c.Err = &v
					delete(o.args, "err")
				}
				m.Changes = append(m.Changes, c)
			case "delete":
				m.Deletes = append(m.Deletes, &fsmpb.Ref{Id: o.str("id"), Version: uint64(o.int("v"))})
			case "depend":
				m.Depends = append(m.Depends, &fsmpb.Ref{Id: o.str("id"), Version: uint64(o.int("v"))})
			case "claimnext":
				// The claim part: the modify's claimant, OP_MODIFY_CLAIM.
				m.Claim = &fsmpb.Claim{Claimant: m.Claimant, Queues: strings.Split(o.str("queues"), ","),
					Lease: o.int("lease"), Limit: max(uint32(o.int("limit")), 1)}
				cmd.Op = fsmpb.Op_OP_MODIFY_CLAIM
			default:
				break ops // not a modify op: the end of this modify
			}
			if err := o.done(); err != nil {
				return nil, 0, fmt.Errorf("%s: %v", body[used], err)
			}
			used++
		}
		if m.Group == "" && len(m.Inserts) > 0 {
			m.Group = GroupOf(m.Inserts[0].Queue)
		}
		if m.Group == "" && m.Claim != nil {
			m.Group = GroupOf(m.Claim.Queues[0])
		}
	case "batch":
		cmd.Op = fsmpb.Op_OP_BATCH
		for used < len(body) {
			sub, n, err := parseCommand(body[used], body[used+1:])
			if err != nil {
				return nil, 0, err
			}
			cmd.Batch = append(cmd.Batch, sub)
			used += 1 + n
		}
	default:
		return nil, 0, fmt.Errorf("unknown command %q", name)
	}
	return cmd, used, a.done()
}

func (tr *transcriptRunner) run(input []string) []string {
	name, args, err := parseArgs(input[0])
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	a := &argReader{args: args}
	var out []string
	switch name {
	case "tick", "modify", "claim", "purge", "batch":
		cmd, used, err := parseCommand(input[0], input[1:])
		if err == nil && used != len(input)-1 {
			err = fmt.Errorf("unexpected line %q", input[1+used])
		}
		if err != nil {
			return []string{"error: " + err.Error()}
		}
		tr.index++
		tr.notified = nil
		res := tr.m.ApplyCommand(tr.index, cmd)
		out = formatResult(res, "")
		if len(tr.notified) > 0 {
			out = append(out, "notify: "+strings.Join(tr.notified, " "))
		}
		return out
	case "state":
		out = append(out, fmt.Sprintf("clock=%d tasks=%d", tr.m.Clock(), tr.m.TaskCount()))
		clock := tr.m.Clock()
		for _, tk := range allTasks(tr.m) {
			out = append(out, taskState(tk, clock)+" "+formatTask(tk))
		}
		tr.m.mu.RLock()
		var ss []*session
		tr.m.st.store.ascendSessions(func(s *session) bool {
			ss = append(ss, s)
			return true
		})
		tr.m.mu.RUnlock()
		sort.Slice(ss, func(i, j int) bool { return ss[i].clientID < ss[j].clientID })
		for _, s := range ss {
			out = append(out, fmt.Sprintf("session %s seq=%d last_seen=%d", s.clientID, s.seq, s.lastSeen))
		}
	case "get":
		for _, tk := range tr.m.Get(strings.Fields(input[0])[1:]) {
			out = append(out, formatTask(tk))
		}
		if len(out) == 0 {
			out = append(out, "none")
		}
		return out
	case "list":
		queue, limit := a.str("queue"), int(a.int("limit"))
		var claimed *bool
		if v, ok := a.args["claimed"]; ok {
			b := v == "true"
			claimed = &b
			delete(a.args, "claimed")
		}
		omit := a.has("omit_values")
		if err := a.done(); err != nil {
			return []string{"error: " + err.Error()}
		}
		token := ""
		for page := 1; ; page++ {
			tasks, next, err := tr.m.List(queue, token, limit, claimed, omit)
			if err != nil {
				return append(out, "error: "+err.Error())
			}
			out = append(out, fmt.Sprintf("page %d: %d tasks", page, len(tasks)))
			for _, tk := range tasks {
				out = append(out, "  "+formatTask(tk))
			}
			if next == "" || page > 100 {
				break
			}
			token = next
		}
	case "queues":
		prefix, limit := a.str("prefix"), int(a.int("limit"))
		for _, q := range tr.m.Queues(prefix, limit) {
			out = append(out, fmt.Sprintf("%s total=%d available=%d claimed=%d delayed=%d oldest=%d",
				q.Name, q.Total, q.Available, q.Claimed, q.Delayed, q.OldestAvailableAt))
		}
		if len(out) == 0 {
			out = append(out, "none")
		}
	case "nextat":
		at, ok := tr.m.NextAt(strings.Split(a.str("queues"), ","))
		out = append(out, fmt.Sprintf("at=%d ok=%v", at, ok))
	case "restore":
		var buf bytes.Buffer
		snap, err := tr.m.Snapshot()
		if err != nil {
			tr.t.Fatal(err)
		}
		if err := snap.(*snapshot).writeTo(&buf); err != nil {
			tr.t.Fatal(err)
		}
		m2 := tr.new(tr.t, tr.options())
		if err := m2.Restore(nopCloser{&buf}); err != nil {
			return []string{"error: " + err.Error()}
		}
		if m2.Digest() != tr.m.Digest() {
			tr.t.Errorf("restore: digest differs")
		}
		tr.m = m2
		out = append(out, fmt.Sprintf("restored %d tasks, clock=%d, applied=%d", m2.TaskCount(), m2.Clock(), m2.AppliedIndex()))
	default:
		return []string{fmt.Sprintf("error: unknown command %q", name)}
	}
	if err := a.done(); err != nil {
		return []string{"error: " + err.Error()}
	}
	return out
}

type nopCloser struct{ *bytes.Buffer }

func (nopCloser) Close() error { return nil }

func allTasks(m *Machine) []*fsmpb.Task {
	m.mu.RLock()
	var ids []string
	m.st.store.ascendQueues("", func(q *queue) bool {
		m.st.store.ascendQueue(q, nil, func(t *task) bool {
			ids = append(ids, t.id)
			return true
		})
		return true
	})
	m.mu.RUnlock()
	sort.Strings(ids)
	ids = slices.Compact(ids)
	return m.Get(ids)
}

func taskState(t *fsmpb.Task, clock int64) string {
	switch {
	case t.At <= clock:
		return "available"
	case t.Claimant != "":
		return "claimed"
	}
	return "delayed"
}

func formatTask(t *fsmpb.Task) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s v%d q=%s at=%d", t.Id, t.Version, t.Queue, t.At)
	if t.Priority != 0 {
		fmt.Fprintf(&b, " prio=%d", t.Priority)
	}
	if t.Claimant != "" {
		fmt.Fprintf(&b, " claimant=%s", t.Claimant)
	}
	if t.Claims != 0 {
		fmt.Fprintf(&b, " claims=%d", t.Claims)
	}
	if t.Key != "" {
		fmt.Fprintf(&b, " key=%s", t.Key)
	}
	if t.Attempt != 0 {
		fmt.Fprintf(&b, " attempt=%d", t.Attempt)
	}
	if t.Err != "" {
		fmt.Fprintf(&b, " err=%q", t.Err)
	}
	if len(t.Value) != 0 {
		fmt.Fprintf(&b, " value=%q", t.Value)
	}
	fmt.Fprintf(&b, " created=%d modified=%d", t.Created, t.Modified)
	return b.String()
}

func formatRefError(e *fsmpb.RefError) string {
	var b strings.Builder
	b.WriteString(e.Category.String())
	if e.Id != "" {
		fmt.Fprintf(&b, " id=%s", e.Id)
	}
	if e.Version != 0 {
		fmt.Fprintf(&b, " version=%d", e.Version)
	}
	if e.CurrentVersion != 0 {
		fmt.Fprintf(&b, " current_version=%d", e.CurrentVersion)
	}
	if e.Queue != "" {
		fmt.Fprintf(&b, " queue=%s", e.Queue)
	}
	if e.Key != "" {
		fmt.Fprintf(&b, " key=%s", e.Key)
	}
	if e.Claimant != "" {
		fmt.Fprintf(&b, " claimant=%s", e.Claimant)
	}
	if e.LeaseUntil != 0 {
		fmt.Fprintf(&b, " lease_until=%d", e.LeaseUntil)
	}
	if e.ExistingId != "" {
		fmt.Fprintf(&b, " existing_id=%s", e.ExistingId)
	}
	return b.String()
}

func formatResult(r *fsmpb.Result, indent string) []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, indent+fmt.Sprintf(format, args...)) }
	switch {
	case r.Failure != nil:
		if r.Failure.Message != "" {
			add("failure: %s", r.Failure.Message)
		} else {
			add("failure:")
		}
		for _, e := range r.Failure.Errors {
			add("  %s", formatRefError(e))
		}
	case r.Modify != nil:
		add("ok")
		for _, t := range r.Modify.Inserted {
			add("  inserted %s", formatTask(t))
		}
		for _, t := range r.Modify.Changed {
			add("  changed %s", formatTask(t))
		}
		if len(r.Modify.Coalesced) > 0 {
			add("  coalesced %v", r.Modify.Coalesced)
		}
		if c := r.Modify.Claim; c != nil {
			add("  claimed %d (expired leases %d)", len(c.Tasks), c.ExpiredLeases)
			for _, t := range c.Tasks {
				add("    %s", formatTask(t))
			}
		}
	case r.Claim != nil:
		add("claimed %d", len(r.Claim.Tasks))
		for _, t := range r.Claim.Tasks {
			add("  %s", formatTask(t))
		}
	case r.Purge != nil:
		add("purged %d", r.Purge.Deleted)
	case r.Batch != nil:
		add("batch of %d", len(r.Batch))
		for i, sub := range r.Batch {
			add("  [%d]", i)
			out = append(out, formatResult(sub, indent+"    ")...)
		}
	default:
		add("ok")
	}
	return out
}
