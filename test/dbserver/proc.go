package dbserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/test/childproc"
)

// InstallHint tells how to get the server binaries.
const InstallHint = "run `make deps` in the repository root (as root: it installs the Debian packages mariadb-server, postgresql and redis-server)"

// readyTimeout bounds the wait for a server to accept connections.
const readyTimeout = 60 * time.Second

// stopGrace is how long a server may take to shut down before it is killed.
const stopGrace = 10 * time.Second

// startAttempts bounds retries when the chosen port was taken in between.
const startAttempts = 3

// findBinary returns the first of names found in dirs (where Debian's
// packages put them) or else in PATH, or an error naming what was searched
// and InstallHint.
func findBinary(names []string, dirs []string) (string, error) {
	for _, name := range names {
		for _, d := range dirs {
			p := filepath.Join(d, name)
			if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
				return p, nil
			}
		}
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%v not found in %v or PATH; %s", names, dirs, InstallHint)
}

// Option changes how a server is started.
type Option func(*options)

type options struct {
	vars [][2]string
	tls  *serverTLS
}

// WithVar sets a server variable: `--name=value` for mariadbd, `-c
// name=value` for postgres, `--name value` for redis-server. It overrides
// the package's defaults.
func WithVar(name, value string) Option {
	return func(o *options) { o.vars = append(o.vars, [2]string{name, value}) }
}

func makeOptions(opts []Option) options {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// proc is one run of a server process.
type proc struct {
	cmd    *exec.Cmd
	exited chan struct{}
	out    *childproc.Output
}

// startProc starts cmd with its output collected; the process gets SIGKILL
// when the test binary dies, so no server outlives a crashed test.
func startProc(cmd *exec.Cmd) (*proc, error) {
	p := &proc{cmd: cmd, exited: make(chan struct{}), out: &childproc.Output{}}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("run %s: %w", cmd.Path, err)
	}
	go func() {
		cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// stop sends sig and waits for the process to exit, killing it after
// stopGrace.
func (p *proc) stop(sig os.Signal) {
	p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(stopGrace):
		p.cmd.Process.Kill()
		<-p.exited
	}
}

// run runs cmd to completion and returns its output in the error.
func run(cmd *exec.Cmd) error {
	out := &childproc.Output{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w; output:\n%s", filepath.Base(cmd.Path), err, out.String())
	}
	return nil
}

// poll calls try until it succeeds, the process exits or readyTimeout
// passes; the error carries try's last error.
func poll(ctx context.Context, exited <-chan struct{}, try func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	for {
		tryCtx, tryCancel := context.WithTimeout(ctx, 2*time.Second)
		err := try(tryCtx)
		tryCancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("exited before accepting connections (last error: %v)", err)
		case <-ctx.Done():
			return fmt.Errorf("no connection within %s: %w (last error: %v)", readyTimeout, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// serverUser is the account a server that refuses root runs as.
type serverUser struct {
	uid, gid uint32
}

// dropTo returns the account to run postgres as: nil when the test runs
// unprivileged (the server runs as the current user), the named system user
// when it runs as root.
func dropTo(name string) (*serverUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("look up user %s to run the server as (it refuses root): %w; %s", name, err, InstallHint)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("user %s: %w", name, err)
	}
	return &serverUser{uid: uint32(uid), gid: uint32(gid)}, nil
}

// apply makes cmd run as u (nothing for nil).
func (u *serverUser) apply(cmd *exec.Cmd) {
	if u == nil {
		return
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: []uint32{}}
}

// chownAll gives u the tree at dir (nothing for nil).
func (u *serverUser) chownAll(dir string) error {
	if u == nil {
		return nil
	}
	return filepath.WalkDir(dir, func(path string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, int(u.uid), int(u.gid))
	})
}

// cleanEnv is the environment the servers run with: nothing from the test's
// environment (MYSQL_*, PG*, REDIS_* variables would change them).
func cleanEnv(home string) []string {
	return []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + home, "LC_ALL=C", "TZ=UTC"}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// running is what every server keeps of its process: the one of the current
// Start, guarded by mu, the signal that stops it, and the directory Close
// removes.
type running struct {
	mu      sync.Mutex
	p       *proc
	stopSig os.Signal
	dir     string
}

// Stop ends the server (its stop signal, then SIGKILL after 10 s), keeping
// its data; Start brings it back on the same address.
func (s *running) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
}

func (s *running) stopLocked() {
	if s.p != nil {
		s.p.stop(s.stopSig)
		s.p = nil
	}
}

// Close stops the server and removes its directory.
func (s *running) Close() {
	s.Stop()
	os.RemoveAll(s.dir)
}

// Output returns what the server printed since its last Start.
func (s *running) Output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p == nil {
		return ""
	}
	return s.p.out.String()
}

// startForTest starts a server with open for one test: it fails the test
// when the server cannot start and closes it at the test's cleanup.
func startForTest[T interface{ Close() }](tb testing.TB, what string, open func(context.Context, ...Option) (T, error), opts []Option) T {
	tb.Helper()
	srv, err := open(context.Background(), opts...)
	if err != nil {
		tb.Fatalf("%s test server: %v", what, err)
	}
	tb.Cleanup(srv.Close)
	return srv
}

// launchLocked starts cmd as the server's process and waits until ready
// succeeds; when it does not, the process is stopped and the error carries
// its output. s.mu must be held.
func (s *running) launchLocked(ctx context.Context, what, addr string, cmd *exec.Cmd, ready func(context.Context) error) error {
	p, err := startProc(cmd)
	if err != nil {
		return fmt.Errorf("start %s: %w", what, err)
	}
	s.p = p
	if err := poll(ctx, p.exited, ready); err != nil {
		s.stopLocked()
		return fmt.Errorf("start %s on %s: %w; output:\n%s", what, addr, err, p.out.String())
	}
	return nil
}
