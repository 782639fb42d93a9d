package auth

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"os"
	"slices"
	"strings"
)

// Tokens maps bearer tokens to principals. It is read from a file with one
// token per line:
//
//	# token               role    [queue-prefix,...]   [name]
//	3f9c1e...             admin
//	b71d0a...             client  jobs/,mail/          worker-pool
//
// A client line without prefixes may use every queue; "*" says so
// explicitly when a name follows. A prefix may hold "/" only as its last
// character, so that it never splits a consistency group. Tokens are compared by their SHA-256, in
// constant time.
type Tokens struct {
	entries []tokenEntry
}

type tokenEntry struct {
	sum [32]byte
	p   Principal
}

// LoadTokens reads a token file.
func LoadTokens(path string) (*Tokens, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read token file: %w", err)
	}
	t, err := ParseTokens(string(data))
	if err != nil {
		return nil, fmt.Errorf("token file %s: %w", path, err)
	}
	return t, nil
}

// MaxPrefixes bounds a token's queue prefixes: every change a restricted
// client makes carries them into the log (fsm.Modify.scope).
const MaxPrefixes = 64

// ParseTokens parses the token file format described on Tokens.
func ParseTokens(text string) (*Tokens, error) {
	t := &Tokens{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for line := 1; sc.Scan(); line++ {
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		f := strings.Fields(s)
		if len(f) < 2 || len(f) > 4 {
			return nil, fmt.Errorf("line %d: want TOKEN ROLE [PREFIXES] [NAME], got %d fields", line, len(f))
		}
		if len(f[0]) < 16 {
			return nil, fmt.Errorf("line %d: token shorter than 16 characters", line)
		}
		p := Principal{Role: f[1], Via: "token", Name: fmt.Sprintf("token-line-%d", line)}
		if !slices.Contains(Roles, p.Role) {
			return nil, fmt.Errorf("line %d: unknown role %q (want one of %s)", line, p.Role, strings.Join(Roles, ", "))
		}
		if len(f) >= 3 && f[2] != "*" {
			if p.Role != RoleClient {
				return nil, fmt.Errorf("line %d: queue prefixes apply to the client role only", line)
			}
			if n := strings.Count(f[2], ",") + 1; n > MaxPrefixes {
				return nil, fmt.Errorf("line %d: %d queue prefixes, more than the limit of %d", line, n, MaxPrefixes)
			}
			for _, pre := range strings.Split(f[2], ",") {
				if pre == "" {
					return nil, fmt.Errorf("line %d: empty queue prefix", line)
				}
				// Changes and deletes name tasks by id within a consistency
				// group (the text before the first "/"), so a prefix must not
				// split a group: "jobs/" or "team-a-" but not "jobs/a".
				if i := strings.Index(pre, "/"); i >= 0 && i != len(pre)-1 {
					return nil, fmt.Errorf("line %d: queue prefix %q splits a consistency group; a prefix may hold \"/\" only as its last character", line, pre)
				}
				p.Prefixes = append(p.Prefixes, pre)
			}
		}
		if len(f) == 4 {
			p.Name = f[3]
		}
		sum := sha256.Sum256([]byte(f[0]))
		for _, e := range t.entries {
			if e.sum == sum {
				return nil, fmt.Errorf("line %d: token listed twice", line)
			}
		}
		t.entries = append(t.entries, tokenEntry{sum: sum, p: p})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return t, nil
}

// Len is the number of tokens.
func (t *Tokens) Len() int {
	if t == nil {
		return 0
	}
	return len(t.entries)
}

// Lookup returns the principal of a token.
func (t *Tokens) Lookup(token string) (Principal, bool) {
	if t == nil {
		return Principal{}, false
	}
	sum := sha256.Sum256([]byte(token))
	var found *Principal
	for i := range t.entries {
		if subtle.ConstantTimeCompare(t.entries[i].sum[:], sum[:]) == 1 {
			found = &t.entries[i].p
		}
	}
	if found == nil {
		return Principal{}, false
	}
	return *found, true
}
