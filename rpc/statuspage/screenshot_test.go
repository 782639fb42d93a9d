//go:build unix

package statuspage_test

import (
	"bytes"
	"context"
	"errors"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The size the page is checked at.
const shotW, shotH = 1280, 900

// chromium finds Debian's chromium (or $CHROMIUM).
func chromium() string {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// screenshotPages renders each page (name -> path under base) in headless
// Chromium at 1280x900 and checks the PNG is a rendered page, not a blank
// or an error. With STATUSPAGE_SCREENSHOT_DIR set the PNGs are kept there
// as <name>.png, to be looked at. Without Chromium the test is skipped,
// except in CI (CI=true), which must install it.
func screenshotPages(t *testing.T, base string, pages map[string]string) {
	bin := chromium()
	if bin == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("chromium is not installed (CI must install Debian's chromium package; see .ci/run)")
		}
		t.Skip("chromium not found on PATH; install Debian's chromium package to run the screenshot check")
	}
	dir := t.TempDir()
	keep := os.Getenv("STATUSPAGE_SCREENSHOT_DIR")
	names := make([]string, 0, len(pages))
	for name := range pages {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		file := filepath.Join(dir, name+".png")
		shoot(t, bin, base+pages[name], file, filepath.Join(dir, "profile-"+name))
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if keep != "" {
			if err := os.MkdirAll(keep, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(keep, name+".png"), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		checkScreenshot(t, name, b)
	}
}

// shoot runs one headless Chromium screenshot, bounded to a minute; the
// browser's whole process group goes when it ends or times out.
func shoot(t *testing.T, bin, url, file, profile string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--hide-scrollbars", "--no-first-run", "--no-default-browser-check", "--disable-extensions",
		"--user-data-dir="+profile, "--screenshot="+file, "--window-size=1280,900", url)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	err := cmd.Run()
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // stragglers
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("chromium took over a minute on %s:\n%s", url, out.String())
	}
	if err != nil {
		t.Fatalf("chromium on %s: %v\n%s", url, err, out.String())
	}
	t.Logf("chromium rendered %s in %v", url, time.Since(start).Round(time.Millisecond))
}

// checkScreenshot decodes a PNG and checks it shows a page: the right size,
// many colours (anti-aliased text), the dark header bar, and text below it.
func checkScreenshot(t *testing.T, name string, b []byte) {
	t.Helper()
	cfg, format, err := image.DecodeConfig(bytes.NewReader(b))
	if err != nil || format != "png" {
		t.Fatalf("%s: not a PNG (%q): %v", name, format, err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if sz := img.Bounds().Size(); sz != (image.Point{shotW, shotH}) || cfg.Width != shotW || cfg.Height != shotH {
		t.Fatalf("%s: screenshot is %v, want %dx%d", name, sz, shotW, shotH)
	}
	colors := map[[3]uint32]bool{}
	var white, header, ink, body int
	bnd := img.Bounds()
	for y := bnd.Min.Y; y < bnd.Max.Y; y++ {
		for x := bnd.Min.X; x < bnd.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			r, g, bl = r>>8, g>>8, bl>>8
			colors[[3]uint32{r, g, bl}] = true
			lum := (299*r + 587*g + 114*bl) / 1000
			switch {
			case r == 255 && g == 255 && bl == 255:
				white++
			case y < 40 && lum < 60: // the header bar
				header++
			case y >= 60 && lum < 110: // text in the page body
				ink++
			}
			if y >= 60 {
				body++
			}
		}
	}
	total := shotW * shotH
	t.Logf("%s: %d colours, %.1f%% white, header %.1f%% of the top 40 rows dark, %.2f%% of the body ink",
		name, len(colors), 100*float64(white)/float64(total), 100*float64(header)/float64(40*shotW), 100*float64(ink)/float64(body))
	var problems []string
	if len(colors) < 16 {
		problems = append(problems, "fewer than 16 colours: no anti-aliased text")
	}
	if float64(white) > 0.97*float64(total) {
		problems = append(problems, "almost all white: blank page")
	}
	if float64(header) < 0.8*float64(40*shotW) {
		problems = append(problems, "no dark header bar across the top")
	}
	if float64(ink) < 0.003*float64(body) {
		problems = append(problems, "hardly any text below the header")
	}
	if len(problems) > 0 {
		t.Fatalf("%s screenshot does not look like the status page: %s", name, strings.Join(problems, "; "))
	}
}

// renderedDOM loads url in headless Chromium and returns the DOM it
// rendered (--dump-dom), after the navigations the page starts within 5 s
// of virtual time (a form it posts, the redirect after it); the test is
// skipped without Chromium, except in CI, as screenshotPages is.
func renderedDOM(t *testing.T, url string) string {
	t.Helper()
	bin := chromium()
	if bin == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("chromium is not installed (CI must install Debian's chromium package; see .ci/run)")
		}
		t.Skip("chromium not found on PATH")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--no-default-browser-check", "--disable-extensions",
		"--user-data-dir="+t.TempDir(), "--virtual-time-budget=5000", "--dump-dom", url)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // stragglers
	}
	if err != nil {
		t.Fatalf("chromium --dump-dom %s: %v\n%s", url, err, errb.String())
	}
	return out.String()
}
