// Package pprofhttp serves net/http/pprof on a process's own --http mux
// (never on http.DefaultServeMux), the same way on nodes and proxies, so
// that `go tool pprof` and `taskbench --profile` reach both.
package pprofhttp
