package pprofhttp

import (
	"net/http"
	"net/http/pprof"

	"github.com/e1158ecb/taskstore/auth"
)

// Register adds /debug/pprof/ (the index and every named profile, e.g.
// allocs?seconds=N), cmdline, profile, symbol and trace to mux. With pol
// enabled every one needs the admin (or node) role, as the status page
// does: a heap profile holds task values and tokens read into memory, and
// cmdline the flags (key and token file paths).
func Register(mux *http.ServeMux, pol *auth.Policy) {
	for path, h := range map[string]http.HandlerFunc{
		"/debug/pprof/":        pprof.Index,
		"/debug/pprof/cmdline": pprof.Cmdline,
		"/debug/pprof/profile": pprof.Profile,
		"/debug/pprof/symbol":  pprof.Symbol,
		"/debug/pprof/trace":   pprof.Trace,
	} {
		mux.Handle(path, pol.RequireAdminHTTPFor("profiles show the process's memory and command line", h))
	}
}
