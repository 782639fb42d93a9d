//go:build !unix

package statuspage_test

import "testing"

func screenshotPages(t *testing.T, base string, pages map[string]string) {
	t.Skip("the Chromium screenshot check runs on unix only")
}

func renderedDOM(t *testing.T, url string) string {
	t.Skip("the Chromium checks run on unix only")
	return ""
}
