package statuspage

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/e1158ecb/taskstore/api/taskstorepb"
	"github.com/e1158ecb/taskstore/auth"
	"github.com/e1158ecb/taskstore/client"
)

// Actions change queues for the page's admin (*rpc.Server's page actions:
// the node's own TaskStore service, forwarded to the shard's leader when
// this node does not lead it).
type Actions interface {
	PauseQueue(ctx context.Context, req *taskstorepb.QueuePauseRequest) (*taskstorepb.QueuePauseResponse, error)
	ResumeQueue(ctx context.Context, req *taskstorepb.QueuePauseRequest) (*taskstorepb.QueuePauseResponse, error)
	Purge(ctx context.Context, req *taskstorepb.PurgeRequest) (*taskstorepb.PurgeResponse, error)
	Modify(ctx context.Context, req *taskstorepb.ModifyRequest) (*taskstorepb.ModifyResponse, error)
	// Time is the node's clock (a move leaves alone the tasks modified
	// after it started).
	Time(ctx context.Context, req *taskstorepb.TimeRequest) (*taskstorepb.TimeResponse, error)
}

// Bounds of an action.
const (
	// DefaultActionTimeout bounds one action; a requeue that runs out of
	// it reports what it moved, and a second click goes on.
	DefaultActionTimeout = 30 * time.Second
	// moveBatch is how many tasks one requeue transaction moves.
	moveBatch = 200
	// maxActionForm bounds a posted form.
	maxActionForm = 16 << 10
)

// actor is who may act on the page, and the form token that proves a form
// was rendered for them (a browser resends basic-auth credentials to any
// page that posts to this origin, so a credential alone does not show the
// admin meant the request).
type actor struct {
	Principal auth.Principal
	Token     string
}

// canAct returns the request's actor when the page has actions and the
// caller is an authenticated admin; the page is read-only for everyone
// else, including every caller of a cluster without authentication.
func (h *Handler) canAct(r *http.Request) (actor, bool) {
	if h.opts.Actions == nil {
		return actor{}, false
	}
	p, ok := auth.FromContext(r.Context())
	if !ok || p.Role != auth.RoleAdmin {
		return actor{}, false
	}
	return actor{Principal: p, Token: h.formToken(p)}, true
}

// formToken is an HMAC of the principal under a key that lives as long as
// the process: forms rendered before a restart need a reload.
func (h *Handler) formToken(p auth.Principal) string {
	m := hmac.New(sha256.New, h.formKey)
	m.Write([]byte(p.Role + "\x00" + p.Name))
	return hex.EncodeToString(m.Sum(nil))
}

func newFormKey() []byte {
	k := make([]byte, 32)
	rand.Read(k)
	return k
}

// actionError is a refusal of a posted action, with the HTTP status and
// the queue to link back to.
type actionError struct {
	code  int
	title string
	msg   string
}

func (e *actionError) Error() string { return e.msg }

// act serves POST /actions: the form names the action (do), the queue and
// the rest of its arguments. A done action redirects to the queue's page
// with a line saying what was done (303, so a reload does not repeat it).
func (h *Handler) act(w http.ResponseWriter, r *http.Request) {
	a, ok := h.canAct(r)
	if !ok {
		msg := "This page is read-only for you: its actions need an authenticated admin (a node started with --auth-tokens or client certificates; see docs/security.md)."
		if h.opts.Actions == nil {
			msg = "This status page has no actions."
		}
		h.renderError(w, http.StatusForbidden, "", "Not allowed", msg)
		return
	}
	if err := sameOrigin(r); err != nil {
		h.opts.Logger.Warn("status page action refused", "principal", a.Principal.Name, "peer", r.RemoteAddr, "err", err)
		h.renderError(w, http.StatusForbidden, "", "Not allowed", err.Error())
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxActionForm)
	if err := r.ParseForm(); err != nil {
		h.renderError(w, http.StatusBadRequest, "", "Bad form", err.Error())
		return
	}
	f := r.PostForm
	if !hmac.Equal([]byte(f.Get("token")), []byte(a.Token)) {
		h.renderError(w, http.StatusForbidden, "", "Not allowed",
			"The form was not rendered for you by this node (or the node restarted since): reload the page and try again.")
		return
	}
	queue := f.Get("queue")
	if queue == "" || taskstorepb.GroupOf(queue) == "" {
		h.renderError(w, http.StatusBadRequest, "", "Bad form", fmt.Sprintf("No valid queue named (%q).", queue))
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), h.opts.ActionTimeout)
	defer cancel()
	do := f.Get("do")
	done, err := h.runAction(ctx, do, queue, f)
	log := h.opts.Logger.With("action", do, "queue", queue, "principal", a.Principal.Name, "peer", r.RemoteAddr)
	if err != nil {
		log.Info("status page action failed", "err", err)
		var ae *actionError
		if !errors.As(err, &ae) {
			ae = apiActionError(err)
		}
		h.renderErrorLink(w, ae.code, "", ae.title, ae.msg, queueURL(queue))
		return
	}
	log.Info("status page action", "done", done)
	back := queueURL(queue)
	switch do {
	case "purge":
		back = "/queues" // the queue is gone
	case "move":
		back = queueURL(strings.TrimSpace(f.Get("to"))) // where the tasks went
	}
	http.Redirect(w, r, back+"?"+url.Values{"done": {done}}.Encode(), http.StatusSeeOther)
}

// sameOrigin refuses a post that a browser says came from another site.
// Browsers send Origin (and Sec-Fetch-Site) with every form post.
func sameOrigin(r *http.Request) error {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return fmt.Errorf("a page of another site (Sec-Fetch-Site: %s) may not act on this one", site)
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return fmt.Errorf("a page of another origin (%s) may not act on this one (%s)", o, r.Host)
		}
	}
	return nil
}

func (h *Handler) runAction(ctx context.Context, do, queue string, f url.Values) (string, error) {
	act := h.opts.Actions
	switch do {
	case "pause":
		if _, err := act.PauseQueue(ctx, &taskstorepb.QueuePauseRequest{Queue: queue}); err != nil {
			return "", err
		}
		return "Paused " + queue + ": it takes inserts but hands out no claims until resumed.", nil
	case "resume":
		if _, err := act.ResumeQueue(ctx, &taskstorepb.QueuePauseRequest{Queue: queue}); err != nil {
			return "", err
		}
		return "Resumed " + queue + ".", nil
	case "purge":
		if f.Get("confirm") != queue {
			return "", &actionError{http.StatusBadRequest, "Not purged",
				fmt.Sprintf("Nothing was deleted: to purge, type the queue's name (%s) in the confirmation box.", queue)}
		}
		res, err := act.Purge(ctx, &taskstorepb.PurgeRequest{Queue: queue})
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("Purged %s: %d task(s) deleted.", queue, res.GetDeleted()), nil
	case "delete":
		id := f.Get("id")
		version, err := strconv.ParseUint(f.Get("version"), 10, 64)
		if id == "" || err != nil || version == 0 {
			return "", &actionError{http.StatusBadRequest, "Bad form", "A delete needs the task's id and version."}
		}
		// As taskctl does: a claimed task is deleted as its claimant.
		req := &taskstorepb.ModifyRequest{Claimant: f.Get("claimant"), Deletes: []*taskstorepb.TaskRef{{Id: id, Version: version, Queue: queue}}}
		if _, err := act.Modify(ctx, req); err != nil {
			return "", err
		}
		return fmt.Sprintf("Deleted task %s (version %d).", id, version), nil
	case "move":
		return h.move(ctx, queue, strings.TrimSpace(f.Get("to")), f.Get("reset") != "")
	}
	return "", &actionError{http.StatusBadRequest, "Bad form", fmt.Sprintf("No action %q.", do)}
}

// move requeues every unclaimed task of src into dst (the dead-letter
// queue back to work) with the client's loop (client.MoveQueueWith, as
// taskctl queue move does): a page at a time, in transactions that name the
// versions read, so a task changed since is left where it is and counted,
// and a batch whose answer would be too large is split. Reads are this
// node's replica's (the page's own), so a version that trails its leader is
// refused and counted the same way.
func (h *Handler) move(ctx context.Context, src, dst string, reset bool) (string, error) {
	if dst == "" || dst == src {
		return "", &actionError{http.StatusBadRequest, "Not moved", "Name another queue to move the tasks to."}
	}
	if taskstorepb.GroupOf(dst) != taskstorepb.GroupOf(src) {
		return "", &actionError{http.StatusBadRequest, "Not moved",
			fmt.Sprintf("%s is not in %s's consistency group (%s): tasks move only within their group.", dst, src, taskstorepb.GroupOf(src))}
	}
	res, err := client.MoveQueueWith(ctx, pageMoveCalls{h}, src, dst, client.MoveOptions{ResetAttempts: reset, Batch: moveBatch})
	if err != nil {
		if res.Moved > 0 || ctx.Err() != nil {
			return fmt.Sprintf("Moved %d task(s) from %s to %s, then stopped (%s); move again for the rest.", res.Moved, src, dst, errText(err)), nil
		}
		return "", err
	}
	msg := fmt.Sprintf("Moved %d task(s) from %s to %s", res.Moved, src, dst)
	if reset {
		msg += ", attempts reset"
	}
	if res.Skipped > 0 {
		msg += fmt.Sprintf("; %d changed meanwhile and were left in %s", res.Skipped, src)
	}
	if res.Conflicts > 0 {
		msg += fmt.Sprintf("; %d could not move (their key is taken in %s) and were left in %s", res.Conflicts, dst, src)
	}
	if res.Claimed > 0 {
		msg += fmt.Sprintf("; %d are held by workers and were left in %s", res.Claimed, src)
	}
	return msg + ".", nil
}

// pageMoveCalls are the calls of a move from the page: this node's clock,
// reads of its own replica, and the page's Modify action (forwarded to the
// shard's leader).
type pageMoveCalls struct{ h *Handler }

func (m pageMoveCalls) Time(ctx context.Context) (time.Time, error) {
	resp, err := m.h.opts.Actions.Time(ctx, &taskstorepb.TimeRequest{})
	if err != nil {
		return time.Time{}, err
	}
	return resp.GetNow().AsTime(), nil
}

func (m pageMoveCalls) Tasks(ctx context.Context, req *taskstorepb.TasksRequest) (*taskstorepb.TasksResponse, error) {
	req.Stale = true
	return m.h.queues.Tasks(ctx, req)
}

func (m pageMoveCalls) Modify(ctx context.Context, req *taskstorepb.ModifyRequest) (*taskstorepb.ModifyResponse, error) {
	return m.h.opts.Actions.Modify(ctx, req)
}

// apiActionError words a refusal of the API for the page.
func apiActionError(err error) *actionError {
	s, _ := status.FromError(err)
	switch s.Code() {
	case codes.InvalidArgument:
		return &actionError{http.StatusBadRequest, "Refused", s.Message()}
	case codes.FailedPrecondition:
		return &actionError{http.StatusConflict, "Refused", s.Message() + " (the page may be out of date: reload it)"}
	case codes.NotFound:
		return &actionError{http.StatusNotFound, "Not found", s.Message()}
	case codes.PermissionDenied, codes.Unauthenticated:
		return &actionError{http.StatusForbidden, "Not allowed", s.Message()}
	case codes.DeadlineExceeded:
		return &actionError{http.StatusGatewayTimeout, "Timed out", "The cluster did not answer in time; the action may or may not have been done: reload the page to see."}
	}
	return &actionError{http.StatusServiceUnavailable, "Not done", errText(err)}
}
