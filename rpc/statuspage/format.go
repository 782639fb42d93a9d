package statuspage

import (
	"encoding/hex"
	"fmt"
	"html/template"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

var funcs = template.FuncMap{
	"age":      age,
	"dur":      fmtDuration,
	"rate":     fmtRate,
	"ts":       fmtTime,
	"rel":      relTime,
	"num":      fmtNum,
	"ids":      fmtIDs,
	"lagClass": lagClass,
	"health":   healthClass,
	"qurl":     queueURL,
}

// valuePreview is how a task's value is shown in a table cell.
type valuePreview struct {
	Size      int
	Text      string // printable UTF-8, possibly truncated
	Truncated bool
	Binary    bool   // not printable UTF-8: shown as hex
	Hex       string // first bytes, when Binary
}

const hexPreviewBytes = 16

// preview shows a printable UTF-8 value as text of at most chars characters
// (line breaks and tabs shown as symbols), anything else as a hex prefix.
func preview(v []byte, chars int) valuePreview {
	p := valuePreview{Size: len(v)}
	if !printable(v) {
		p.Binary = true
		n := min(len(v), hexPreviewBytes)
		p.Hex = hex.EncodeToString(v[:n])
		p.Truncated = n < len(v)
		return p
	}
	var b strings.Builder
	n := 0
	for _, r := range string(v) {
		if n == chars {
			p.Truncated = true
			break
		}
		switch r {
		case '\n':
			r = '↵'
		case '\r':
			continue
		case '\t':
			r = '→'
		}
		b.WriteRune(r)
		n++
	}
	p.Text = b.String()
	return p
}

// printable reports whether v is valid UTF-8 of printable characters and
// ordinary white space.
func printable(v []byte) bool {
	if !utf8.Valid(v) {
		return false
	}
	for _, r := range string(v) {
		if !unicode.IsPrint(r) && r != '\n' && r != '\r' && r != '\t' {
			return false
		}
	}
	return true
}

func age(d *durationpb.Duration) string {
	if d == nil {
		return "—"
	}
	return fmtDuration(d.AsDuration())
}

// fmtDuration is a short human duration: 420µs, 850ms, 12.3s, 4m 05s, 2h 07m,
// 3d 04h.
func fmtDuration(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	switch {
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm %02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh %02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd %02dh", int(d.Hours())/24, int(d.Hours())%24)
}

func fmtRate(r float64) string {
	switch {
	case r == 0:
		return "0"
	case r < 0.01:
		return "<0.01/s"
	case r < 10:
		return strconv.FormatFloat(r, 'f', 2, 64) + "/s"
	case r < 10000:
		return strconv.FormatFloat(r, 'f', 0, 64) + "/s"
	}
	return strconv.FormatFloat(r/1000, 'f', 1, 64) + "k/s"
}

func fmtTime(t *timestamppb.Timestamp) string {
	if t == nil {
		return "—"
	}
	return t.AsTime().UTC().Format("2006-01-02 15:04:05.000Z")
}

// relTime is t relative to now: "in 5.0s", "3m 02s ago".
func relTime(t *timestamppb.Timestamp, now time.Time) string {
	if t == nil {
		return "—"
	}
	d := t.AsTime().Sub(now)
	if d > 0 {
		return "in " + fmtDuration(d)
	}
	return fmtDuration(d) + " ago"
}

// fmtNum groups digits by thousands with thin spaces.
func fmtNum(n uint64) string {
	s := strconv.FormatUint(n, 10)
	if len(s) <= 4 {
		return s
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteRune('\u202f')
		}
		b.WriteRune(c)
	}
	return b.String()
}

func fmtIDs(ids []uint32) string {
	if len(ids) == 0 {
		return "—"
	}
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = strconv.FormatUint(uint64(id), 10)
	}
	return strings.Join(parts, ", ")
}

func lagClass(lag, alert uint64) string {
	switch {
	case lag == 0:
		return "ok"
	case lag < alert:
		return "warn"
	}
	return "bad"
}

func healthClass(h string) string {
	switch h {
	case "alive", "member", "leader":
		return "ok"
	case "suspect", "waiting", "draining", "candidate", "nonvoter":
		return "warn"
	case "dead", "left", "removed", "shutdown", "diverged":
		return "bad"
	}
	return "muted"
}
