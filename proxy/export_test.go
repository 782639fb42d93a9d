package proxy

import "net/http"

// MaxWait is maxWait, for the test that keeps it equal to rpc.MaxWait.
const MaxWait = maxWait

// HTTPHandler is the proxy's --http handler, for tests that drive it
// without a listener.
func (s *Server) HTTPHandler() (http.Handler, error) {
	return s.httpHandler()
}
