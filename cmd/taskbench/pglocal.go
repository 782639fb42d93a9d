package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/e1158ecb/taskstore/internal/freeport"
)

// pgServer is a throwaway PostgreSQL server for --baseline postgres
// --local: initdb into a temporary directory, pg_ctl start on a free
// 127.0.0.1 port (its Unix socket in the same directory), stopped and
// removed afterwards.
type pgServer struct {
	dir    string // temporary directory: data/, the socket, postgres.log
	data   string
	bindir string
	asUser string // when root: run initdb and pg_ctl as this user (runuser)
	port   string
	dsn    string
}

// pgBinDir finds a directory with initdb and pg_ctl: $PG_BINDIR, else the
// newest /usr/lib/postgresql/<major>/bin (Debian's postgresql package),
// else the directory of initdb on PATH.
func pgBinDir(getenv func(string) string) (string, error) {
	has := func(d string) bool {
		for _, b := range []string{"initdb", "pg_ctl", "postgres"} {
			if fi, err := os.Stat(filepath.Join(d, b)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if d := getenv("PG_BINDIR"); d != "" {
		if has(d) {
			return d, nil
		}
		return "", fmt.Errorf("$PG_BINDIR=%s has no initdb, pg_ctl and postgres", d)
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	major := func(d string) float64 {
		v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(d)), 64)
		return v
	}
	slices.SortFunc(dirs, func(a, b string) int {
		switch ma, mb := major(a), major(b); {
		case ma > mb:
			return -1
		case ma < mb:
			return 1
		}
		return 0
	})
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	return "", errors.New("PostgreSQL not found: no initdb/pg_ctl under /usr/lib/postgresql/*/bin, in $PG_BINDIR or on PATH " +
		"(Debian: apt-get install postgresql)")
}

// pgRunAs returns the user to run the server as: none when we are not root;
// as root (initdb and postgres refuse to run as root) the user postgres
// that Debian's package creates, through runuser.
func pgRunAs() (string, error) {
	if os.Geteuid() != 0 {
		return "", nil
	}
	if _, err := user.Lookup("postgres"); err != nil {
		return "", errors.New("running as root, and PostgreSQL refuses to: create a user named postgres " +
			"(Debian's postgresql package does) or run taskbench as a non-root user")
	}
	if _, err := exec.LookPath("runuser"); err != nil {
		return "", errors.New("running as root: runuser (util-linux) is needed to start PostgreSQL as the user postgres")
	}
	return "postgres", nil
}

// pgAvailable says why a local PostgreSQL cannot be started here, or nil.
func pgAvailable(getenv func(string) string) error {
	if _, err := pgBinDir(getenv); err != nil {
		return err
	}
	_, err := pgRunAs()
	return err
}

func (s *pgServer) command(name string, args ...string) *exec.Cmd {
	bin := filepath.Join(s.bindir, name)
	if s.asUser != "" {
		args = append([]string{"-u", s.asUser, "--", bin}, args...)
		bin = "runuser"
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = s.dir // the server's user may not be able to enter our working directory
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	return cmd
}

func (s *pgServer) run(name string, args ...string) error {
	out, err := s.command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// startLocalPostgres initialises and starts a server that accepts
// maxConns connections, with PostgreSQL's default durability (fsync and
// synchronous_commit on, said explicitly), and trust authentication for
// the user taskbench on 127.0.0.1 and the socket only.
func startLocalPostgres(ctx context.Context, maxConns int, getenv func(string) string) (*pgServer, error) {
	bindir, err := pgBinDir(getenv)
	if err != nil {
		return nil, err
	}
	asUser, err := pgRunAs()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "taskbench-pg-")
	if err != nil {
		return nil, err
	}
	s := &pgServer{dir: dir, data: filepath.Join(dir, "data"), bindir: bindir, asUser: asUser}
	if asUser != "" {
		u, err := user.Lookup(asUser)
		if err == nil {
			uid, _ := strconv.Atoi(u.Uid)
			gid, _ := strconv.Atoi(u.Gid)
			err = os.Chown(dir, uid, gid)
		}
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	// --no-sync only skips initdb's own final flush of the new files; the
	// server below runs with fsync on.
	if err := s.run("initdb", "-D", s.data, "-U", "taskbench", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if ctx.Err() != nil {
		os.RemoveAll(dir)
		return nil, ctx.Err()
	}
	addr, err := freeport.Addr()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	_, port, _ := net.SplitHostPort(addr)
	s.port = port
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %s -k %s -c max_connections=%d -c fsync=on -c synchronous_commit=on",
		s.port, dir, max(maxConns, 20))
	if err := s.run("pg_ctl", "start", "-D", s.data, "-l", filepath.Join(dir, "postgres.log"), "-w", "-t", "60", "-o", opts); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
		s.stop()
		return nil, fmt.Errorf("%w\npostgres.log:\n%s", err, strings.TrimSpace(string(log)))
	}
	// TCP on loopback, like the client's connections to taskstored.
	s.dsn = fmt.Sprintf("host=127.0.0.1 port=%s user=taskbench dbname=postgres sslmode=disable connect_timeout=10", s.port)
	return s, nil
}

// stop shuts the server down (fast: open sessions are ended, then a clean
// shutdown; immediate if that fails) and removes its directory.
func (s *pgServer) stop() {
	if _, err := os.Stat(filepath.Join(s.data, "postmaster.pid")); err == nil {
		if err := s.run("pg_ctl", "stop", "-D", s.data, "-m", "fast", "-w", "-t", "30"); err != nil {
			s.run("pg_ctl", "stop", "-D", s.data, "-m", "immediate", "-w", "-t", "30")
			time.Sleep(100 * time.Millisecond)
		}
	}
	os.RemoveAll(s.dir)
}
