package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite docs/taskctl.md from the command tree (make docs)")

// docsHeader is the hand-written part of docs/taskctl.md: what no command's
// help says (output, exit codes, the decisions behind the commands). The
// command reference after it is generated from the command tree, so the
// manual cannot name a flag or a command that taskctl does not have.
const docsHeader = "manual.md"

const docsPath = "../../docs/taskctl.md"

// TestManualMatchesCommands checks that docs/taskctl.md is manual.md
// followed by the reference generated from the cobra command tree (every
// command's usage, help, examples and flags, by cobra/doc). `make docs`
// rewrites it; `make docs-check` runs this test.
func TestManualMatchesCommands(t *testing.T) {
	want, err := generateManual()
	if err != nil {
		t.Fatal(err)
	}
	if *updateDocs {
		if err := os.WriteFile(docsPath, want, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(docsPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("docs/taskctl.md is not what the command tree and cmd/taskctl/manual.md make: run `make docs` (first difference at line %d)", firstDiffLine(got, want))
	}
}

// generateManual renders the manual with an empty environment, so no
// default read from the environment of the machine that runs it shows.
func generateManual() ([]byte, error) {
	header, err := os.ReadFile(docsHeader)
	if err != nil {
		return nil, err
	}
	a := &app{ctx: context.Background(), stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
	root := a.rootCmd()
	var b bytes.Buffer
	b.Write(header)
	b.WriteString("\n## Command reference\n\nGenerated from the command tree (`make docs`); `taskctl COMMAND --help` prints the same. The\nglobal flags (`taskctl`'s options) apply to every command.\n\n")
	link := func(name string) string {
		// taskctl_node_add.md -> the section's anchor.
		return "#" + strings.ReplaceAll(strings.TrimSuffix(name, ".md"), "_", "-")
	}
	var walk func(c *cobra.Command) error
	walk = func(c *cobra.Command) error {
		if !c.IsAvailableCommand() && c.HasParent() {
			return nil
		}
		c.DisableAutoGenTag = true
		// task claim's default claimant names this machine and process.
		if f := c.LocalFlags().Lookup("claimant"); f != nil && f.DefValue == defaultClaimant() {
			f.DefValue = "taskctl-<hostname>-<pid>"
		}
		var sec bytes.Buffer
		if err := doc.GenMarkdownCustom(c, &sec, link); err != nil {
			return fmt.Errorf("%s: %w", c.CommandPath(), err)
		}
		// One file holds every command: a section per command, a level
		// below the manual's own sections.
		s := sec.String()
		s = strings.Replace(s, "## ", "### ", 1)
		s = strings.ReplaceAll(s, "\n### ", "\n#### ")
		s = dropSection(s, "#### Options inherited from parent commands")
		b.WriteString(s)
		b.WriteString("\n")
		for _, sub := range c.Commands() {
			if err := walk(sub); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(root); err != nil {
		return nil, err
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

// dropSection removes every section headed title, up to the next heading of
// its level: the global flags would otherwise repeat under every command.
func dropSection(s, title string) string {
	for {
		i := strings.Index(s, title+"\n")
		if i < 0 {
			return s
		}
		j := strings.Index(s[i+len(title):], "\n#### ")
		if j < 0 {
			return s[:i]
		}
		s = s[:i] + s[i+len(title)+j+1:]
	}
}

func firstDiffLine(a, b []byte) int {
	la, lb := strings.Split(string(a), "\n"), strings.Split(string(b), "\n")
	for i := range min(len(la), len(lb)) {
		if la[i] != lb[i] {
			return i + 1
		}
	}
	return min(len(la), len(lb)) + 1
}
