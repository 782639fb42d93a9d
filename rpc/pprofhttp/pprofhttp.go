package pprofhttp

import (
	"net/http"
	"net/http/pprof"
)

// Register adds /debug/pprof/ (the index and every named profile, e.g.
// allocs?seconds=N), cmdline, profile, symbol and trace to mux.
func Register(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}
