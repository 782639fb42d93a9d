package proxy

import "net/http"

// MaxWait is maxWait, for the test that keeps it equal to rpc.MaxWait.
const MaxWait = maxWait

// HTTPHandler is the proxy's --http handler, for tests that drive it
// without a listener.
func (s *Server) HTTPHandler() (http.Handler, error) {
	return s.httpHandler()
}

// AnswerBytesHeld is the bytes of answers the proxy holds now.
func (s *Server) AnswerBytesHeld() int64 { return s.answers.held.Load() }
