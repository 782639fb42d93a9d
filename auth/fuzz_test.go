package auth

import (
	"slices"
	"testing"
)

// FuzzParseTokens: any token file either parses or is refused; never a
// panic, and every parsed principal has a known role.
func FuzzParseTokens(f *testing.F) {
	f.Add("0123456789abcdef admin\n")
	f.Add("# c\nfedcba9876543210 client jobs/,mail/ workers\n")
	f.Add("xxxxxxxxxxxxxxxx client * n\n\n  \t")
	f.Fuzz(func(t *testing.T, text string) {
		tk, err := ParseTokens(text)
		if err != nil {
			return
		}
		for _, e := range tk.entries {
			if !slices.Contains(Roles, e.p.Role) {
				t.Fatalf("parsed role %q", e.p.Role)
			}
		}
	})
}

// FuzzDecodePrincipal: the header a proxy sends decodes or is refused, and
// what decodes encodes back to the same principal.
func FuzzDecodePrincipal(f *testing.F) {
	f.Add("role=client&name=w&via=token&prefix=jobs%2F")
	f.Add("role=admin&name=a")
	f.Add("role=%zz")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := decodePrincipal(s)
		if err != nil {
			return
		}
		q, err := decodePrincipal(p.encode())
		if err != nil || q.Role != p.Role || q.Name != p.Name || !slices.Equal(q.Prefixes, p.Prefixes) {
			t.Fatalf("round trip of %+v: %+v %v", p, q, err)
		}
	})
}
