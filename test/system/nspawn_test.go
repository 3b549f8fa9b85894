package system

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The container's root filesystem: Debian bookworm with systemd, built once
// by debootstrap and cached outside the repository. rpm is included so the
// .rpm's scriptlets can run without network access from inside.
const (
	rootfsSuite    = "bookworm"
	rootfsMirror   = "http://deb.debian.org/debian"
	rootfsIncludes = "systemd,systemd-sysv,dbus,curl,iproute2,procps,rpm,acl"
	// rootfsCacheEnv moves the cache (default /var/cache/cube-templatecenter-test).
	rootfsCacheEnv = "CUBE_TC_SYSTEM_TEST_CACHE"
)

// skipRealSystemd skips the end-to-end suite where this machine cannot run
// it (not root, or its tools cannot be installed), saying so on stderr too.
// Under CI (CI set) it fails instead: CI must run the suite, and `go test`
// hides skips of passing packages.
func skipRealSystemd(t *testing.T) {
	t.Helper()
	reason := ""
	if os.Getuid() != 0 {
		reason = "needs root (systemd-nspawn, debootstrap, nsenter); run `go test ./test/system/` as root"
	} else if err := installTools("systemd-nspawn", "debootstrap", "nsenter"); err != nil {
		reason = fmt.Sprintf("cannot install systemd-container and debootstrap: %v", err)
	}
	if reason == "" {
		return
	}
	msg := "SKIPPED: real-systemd suite: " + reason
	if os.Getenv("CI") != "" {
		t.Fatal(msg + " (CI is set: the suite must run here)")
	}
	fmt.Fprintln(os.Stderr, t.Name()+": "+msg)
	t.Skip(msg)
}

// rootfs returns the cached root filesystem, building it under a temporary
// name and renaming it when debootstrap succeeded, so an interrupted build is
// never reused. A lock file serializes concurrent test runs.
func rootfs(t *testing.T) string {
	t.Helper()
	cache := os.Getenv(rootfsCacheEnv)
	if cache == "" {
		cache = "/var/cache/cube-templatecenter-test"
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Fatal(err)
	}
	recipe := strings.Join([]string{rootfsSuite, "minbase", rootfsIncludes, rootfsMirror}, " ")
	sum := sha256.Sum256([]byte(recipe))
	final := filepath.Join(cache, "rootfs-"+rootfsSuite+"-"+hex.EncodeToString(sum[:])[:12])

	lock, err := os.OpenFile(filepath.Join(cache, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)

	if _, err := os.Stat(filepath.Join(final, "usr/lib/systemd/systemd")); err == nil {
		return final
	}
	// Under the lock, leftovers of interrupted builds are garbage.
	leftovers, _ := filepath.Glob(filepath.Join(cache, ".tmp-rootfs-*"))
	for _, dir := range leftovers {
		os.RemoveAll(dir)
	}
	tmp := filepath.Join(cache, ".tmp-rootfs-"+strconv.Itoa(os.Getpid()))
	t.Logf("building the container root filesystem (once; cached in %s): debootstrap %s", final, recipe)
	start := time.Now()
	if _, err := runErr(t.Context(), "debootstrap", "--variant=minbase", "--include="+rootfsIncludes,
		rootfsSuite, tmp, rootfsMirror); err != nil {
		os.RemoveAll(tmp)
		t.Fatalf("debootstrap: %v", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		t.Fatal(err)
	}
	t.Logf("root filesystem built in %s", time.Since(start).Round(time.Second))
	return final
}

// container is a booted systemd-nspawn container sharing the host network.
type container struct {
	t      *testing.T
	cmd    *exec.Cmd
	leader int
	log    string
}

// boot starts a container from the cached root filesystem with an overlay
// (the cache stays pristine), the directories binds mounted read-only at
// their keys, and waits until its systemd finished booting.
func boot(t *testing.T, binds map[string]string) *container {
	t.Helper()
	root := rootfs(t)
	if ln, err := net.Listen("tcp", "127.0.0.1:8090"); err != nil {
		t.Fatalf("port 8090 is busy on this host, and the container shares the host network: %v", err)
	} else {
		ln.Close()
	}
	args := []string{"-D", root, "-b", "--register=no", "--keep-unit", "--console=passive",
		"--volatile=overlay", "--machine=tc-system-test"}
	for dst, src := range binds {
		args = append(args, "--bind-ro="+src+":"+dst)
	}
	logPath := filepath.Join(t.TempDir(), "nspawn.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("systemd-nspawn", args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("systemd-nspawn: %v", err)
	}
	logFile.Close()
	c := &container{t: t, cmd: cmd, log: logPath}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { c.stop(exited) })

	deadline := time.Now().Add(30 * time.Second)
	for c.leader == 0 {
		// The container's PID 1 is the child of systemd-nspawn that has
		// become systemd (it starts as a copy of systemd-nspawn).
		data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
		for _, f := range strings.Fields(string(data)) {
			if comm, _ := os.ReadFile("/proc/" + f + "/comm"); strings.TrimSpace(string(comm)) == "systemd" {
				c.leader, _ = strconv.Atoi(f)
			}
		}
		if c.leader != 0 {
			break
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("systemd-nspawn exited: %v\n%s", err, c.consoleTail())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("systemd-nspawn started no container within 30s\n%s", c.consoleTail())
		}
	}
	// Right after exec, systemd's bus is not up yet ("offline" or no
	// answer): ask again until it waits for the boot to finish.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var state string
	for {
		out, err := c.execCtx(ctx, "systemctl", "is-system-running", "--wait")
		state = strings.TrimSpace(out)
		if state != "" && state != "offline" {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("container did not boot: is-system-running=%q (%v)\n%s", state, err, c.consoleTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if state != "running" && state != "degraded" {
		t.Fatalf("container did not boot: is-system-running=%q\n%s", state, c.consoleTail())
	}
	if state == "degraded" {
		failed, _ := c.exec("systemctl", "--failed", "--no-legend")
		t.Logf("container booted degraded; failed units:\n%s", failed)
	}
	return c
}

// stop shuts the container down cleanly (SIGTERM to systemd-nspawn), killing
// it if that takes too long.
func (c *container) stop(exited chan error) {
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		c.t.Logf("container did not stop within 30s: killing it")
		c.cmd.Process.Kill()
		<-exited
	}
}

func (c *container) consoleTail() string {
	data, _ := os.ReadFile(c.log)
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return "container console:\n" + string(data)
}

// exec runs a command inside the container (all of its namespaces).
func (c *container) exec(args ...string) (string, error) {
	return c.execCtx(c.t.Context(), args...)
}

func (c *container) execCtx(ctx context.Context, args ...string) (string, error) {
	return runErr(ctx, "nsenter", append([]string{"-t", strconv.Itoa(c.leader), "-a"}, args...)...)
}

// must runs a command inside the container and fails the test if it fails.
func (c *container) must(args ...string) string {
	c.t.Helper()
	out, err := c.exec(args...)
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

// path is where a path inside the container is seen from the host.
func (c *container) path(p string) string {
	return filepath.Join("/proc", strconv.Itoa(c.leader), "root", p)
}

func (c *container) readFile(p string) string {
	c.t.Helper()
	data, err := os.ReadFile(c.path(p))
	if err != nil {
		c.t.Fatal(err)
	}
	return string(data)
}

func (c *container) writeFile(p, content string, mode os.FileMode) {
	c.t.Helper()
	if err := os.MkdirAll(filepath.Dir(c.path(p)), 0o755); err != nil {
		c.t.Fatal(err)
	}
	if err := os.WriteFile(c.path(p), []byte(content), mode); err != nil {
		c.t.Fatal(err)
	}
}

func (c *container) exists(p string) bool {
	_, err := os.Lstat(c.path(p))
	return err == nil
}

// show returns unit properties.
func (c *container) show(unit string, props ...string) map[string]string {
	c.t.Helper()
	out := c.must("systemctl", "show", "-p", strings.Join(props, ","), unit)
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			m[k] = v
		}
	}
	return m
}

// prop returns one unit property.
func (c *container) prop(unit, name string) string {
	c.t.Helper()
	return c.show(unit, name)[name]
}

// journal returns the unit's journal as plain messages.
func (c *container) journal(unit string) string {
	c.t.Helper()
	out, err := c.exec("journalctl", "--no-pager", "-o", "cat", "-u", unit)
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

// waitUntil polls cond until it holds; the limit only bounds a hang.
func (c *container) waitUntil(what string, limit time.Duration, cond func() (bool, string)) {
	c.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: still not the case after %s (last: %s)", what, limit, state)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// dumpOnFailure logs the units' status and journal when the test failed.
func (c *container) dumpOnFailure() {
	c.t.Cleanup(func() {
		if !c.t.Failed() {
			return
		}
		// t.Context() is already canceled in cleanups.
		ctx := context.Background()
		status, _ := c.execCtx(ctx, "systemctl", "--no-pager", "status", socketUnit, serviceUnit)
		journal, _ := c.execCtx(ctx, "journalctl", "--no-pager", "-n", "300", "-o", "short-monotonic")
		c.t.Logf("container state at failure:\n%s\njournal (last 300 lines):\n%s", status, journal)
	})
}
