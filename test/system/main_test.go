package system

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/test/s3server"
)

const (
	// v1 and v2 are the package versions built for the tests; v2 is the
	// upgrade.
	v1 = "1.0.0"
	v2 = "1.0.1"

	serviceUnit = "cube-sandbox-cube-templatecenter.service"
	socketUnit  = "cube-sandbox-cube-templatecenter.socket"
	pkgName     = "cube-templatecenter"
)

// repoRoot is the checkout under test: two levels above this package.
var repoRoot = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}()

// workDir holds what the tests build once per run (packages); TestMain
// creates and removes it.
var workDir string

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "templatecenter-system-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "create work directory:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	workDir = dir
	defer s3srv.Close()
	return m.Run()
}

// s3srv is the package's one S3 server on the host, started on first use.
var s3srv s3server.Shared

// build is one `make deb rpm` output.
type build struct {
	Version string
	Deb     string // the .deb
	RPM     string // the .rpm
	Binary  string // the binary both packages hold
}

// makeEnv is the environment for a nested make: under `make test`, the
// outer make's flags and variables must not leak into it.
func makeEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "MAKEFLAGS" && k != "MFLAGS" && k != "MAKELEVEL" {
			env = append(env, kv)
		}
	}
	return env
}

// builds makes the v1 and v2 packages once per test binary. The packager is
// installed first (`make nfpm`, which may fetch it); the packages are then
// built with the module proxy off, so a build that reaches for the network
// fails here.
var builds = sync.OnceValues(func() ([]build, error) {
	cmd := exec.Command("make", "-C", repoRoot, "--no-print-directory", "nfpm")
	cmd.Env = makeEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("make nfpm: %w\n%s", err, out)
	}
	var out []build
	for _, v := range []string{v1, v2} {
		dist := filepath.Join(workDir, "dist-"+v)
		cmd := exec.Command("make", "-C", repoRoot, "--no-print-directory", "deb", "rpm", "VERSION="+v, "DIST="+dist)
		cmd.Env = append(makeEnv(), "GOPROXY=off", "GOFLAGS=-mod=mod")
		var log bytes.Buffer
		cmd.Stdout, cmd.Stderr = &log, &log
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("make deb rpm VERSION=%s GOPROXY=off (offline, once the packager is installed): %w\n%s", v, err, log.String())
		}
		b := build{Version: v, Binary: filepath.Join(dist, "stage-"+v, "templatecenter")}
		debs, _ := filepath.Glob(filepath.Join(dist, pkgName+"_"+v+"-1_*.deb"))
		rpms, _ := filepath.Glob(filepath.Join(dist, pkgName+"-"+v+"-1.*.rpm"))
		if len(debs) != 1 || len(rpms) != 1 {
			return nil, fmt.Errorf("make deb rpm VERSION=%s left debs %v and rpms %v in %s\n%s", v, debs, rpms, dist, log.String())
		}
		b.Deb, b.RPM = debs[0], rpms[0]
		out = append(out, b)
	}
	return out, nil
})

// packages returns the v1 and v2 builds, building them on first use.
func packages(t *testing.T) (old, upgrade build) {
	t.Helper()
	needTools(t, "make", "gcc", "objdump", "gzip")
	bs, err := builds()
	if err != nil {
		t.Fatal(err)
	}
	return bs[0], bs[1]
}

// toolPackages maps the tools the tests run to the Debian packages that
// provide them.
var toolPackages = map[string]string{
	"systemd-analyze": "systemd", "systemd-sysusers": "systemd", "systemd-tmpfiles": "systemd",
	"systemd-nspawn": "systemd-container", "debootstrap": "debootstrap", "lintian": "lintian",
	"rpm": "rpm", "dpkg-deb": "dpkg", "shellcheck": "shellcheck", "make": "make", "gcc": "gcc",
	"objdump": "binutils", "gzip": "gzip", "setpriv": "util-linux", "unshare": "util-linux",
	"nsenter": "util-linux",
}

var aptMu sync.Mutex

// installTools installs the Debian packages of the missing tools when root;
// it reports what is still missing.
func installTools(tools ...string) error {
	aptMu.Lock()
	defer aptMu.Unlock()
	missing := map[string]bool{}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			missing[toolPackages[tool]] = true
		}
	}
	if len(missing) == 0 {
		return nil
	}
	var pkgs []string
	for p := range missing {
		pkgs = append(pkgs, p)
	}
	if os.Getuid() != 0 {
		return fmt.Errorf("missing packages %v and not root to install them", pkgs)
	}
	args := append([]string{"install", "-y", "-qq", "--no-install-recommends"}, pkgs...)
	install := func() ([]byte, error) {
		cmd := exec.Command("apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		return cmd.CombinedOutput()
	}
	if _, err := install(); err != nil {
		if out, err := exec.Command("apt-get", "update", "-qq").CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get update: %w\n%s", err, out)
		}
		if out, err := install(); err != nil {
			return fmt.Errorf("apt-get install %v: %w\n%s", pkgs, err, out)
		}
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s still missing after installing %v", tool, pkgs)
		}
	}
	return nil
}

// needTools makes the tools available or fails the test.
func needTools(t *testing.T, tools ...string) {
	t.Helper()
	if err := installTools(tools...); err != nil {
		t.Fatalf("test tools: %v", err)
	}
}

// run runs a command and returns its standard output, failing the test with
// both streams when it fails.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := runErr(t.Context(), name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// runErr runs a command; its error carries the command line, the exit
// status and both output streams.
func runErr(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w\nstdout:\n%s\nstderr:\n%s",
			name, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}
