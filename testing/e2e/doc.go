// Package e2e holds end-to-end tests that run real taskstored processes on
// loopback and drive them with the Go client.
package e2e
