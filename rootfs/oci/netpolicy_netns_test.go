package oci

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// netnsEnv names the test a re-executed test binary runs inside namespaces
// of its own (see inNetns).
const netnsEnv = "TC_OCI_NETNS_TEST"

// netns is the network a test runs in: addresses on lo, and names in its
// /etc/hosts. Test traffic then only ever reaches lo inside the test's own
// namespace, whatever address it is for.
type netns struct {
	// addrs are CIDRs put on lo, e.g. "10.99.0.1/32".
	addrs []string
	// hosts maps names to addresses, the namespace's /etc/hosts.
	hosts map[string]string
	// routes are added after the addresses, each the arguments of
	// `ip route add`.
	routes []string
}

// inNetns runs the calling top-level test again, in a child process with
// a network and a mount namespace of its own (lo up with ns.addrs,
// /etc/hosts replaced by ns.hosts). It returns true in the child, where
// the test goes on, and false in the parent once the child has passed;
// the child's failure fails the test. Without root the test is skipped.
func inNetns(t *testing.T, ns netns) bool {
	t.Helper()
	if os.Getenv(netnsEnv) == t.Name() {
		ns.setUp(t)
		return true
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs in a network and a mount namespace of its own")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip (iproute2) to set up its network namespace")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), netnsEnv+"="+t.Name())
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) {
		t.Skipf("cannot make namespaces here: %v", err)
	}
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("%s in its own namespaces: %v\n%s", t.Name(), err, out)
	}
	if testing.Verbose() {
		t.Logf("in its own namespaces:\n%s", out)
	}
	return false
}

// setUp brings the namespace's lo up with ns.addrs and mounts ns.hosts
// over /etc/hosts, in the child.
func (ns netns) setUp(t *testing.T) {
	t.Helper()
	ip := func(args ...string) {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ip("link", "set", "lo", "up")
	for _, a := range ns.addrs {
		args := []string{"addr", "add", a, "dev", "lo"}
		if strings.Contains(a, ":") {
			args = append(args, "nodad") // usable at once, not tentative
		}
		ip(args...)
	}
	// The kernel installs an IPv6 address's local route a moment after
	// the address: wait for it, or the address is not yet the host's.
	for _, a := range ns.addrs {
		addr, _, _ := strings.Cut(a, "/")
		if !strings.Contains(addr, ":") {
			continue
		}
		for deadline := time.Now().Add(5 * time.Second); ; {
			out, err := exec.Command("ip", "-6", "route", "get", addr).Output()
			if err == nil && strings.HasPrefix(string(out), "local ") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no local route for %s: %s %v", addr, out, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for _, r := range ns.routes {
		ip(append([]string{"route", "add"}, strings.Fields(r)...)...)
	}
	// Private mounts: the bind mount stays in this namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		t.Fatalf("make mounts private: %v", err)
	}
	var b strings.Builder
	b.WriteString("127.0.0.1 localhost\n::1 localhost\n")
	for _, name := range slices.Sorted(maps.Keys(ns.hosts)) {
		fmt.Fprintf(&b, "%s %s\n", ns.hosts[name], name)
	}
	hosts := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hosts, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(hosts, "/etc/hosts", "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("mount %s over /etc/hosts: %v", hosts, err)
	}
	netnsHosts = hosts
	t.Cleanup(func() {
		unix.Unmount("/etc/hosts", 0)
		netnsHosts = ""
	})
}

// netnsHosts is the file mounted over /etc/hosts in the namespace, ""
// outside it.
var netnsHosts string

// rehost points name at addr in the namespace's /etc/hosts and waits
// until the resolver answers with it (Go reads the file again after 5
// seconds).
func rehost(t *testing.T, name, addr string) {
	t.Helper()
	if netnsHosts == "" {
		t.Fatal("rehost outside a test namespace")
	}
	b, err := os.ReadFile(netnsHosts)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if f := strings.Fields(l); len(f) != 2 || f[1] != name {
			lines = append(lines, l)
		}
	}
	lines = append(lines, addr+" "+name)
	if err := os.WriteFile(netnsHosts, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		got, err := net.DefaultResolver.LookupHost(context.Background(), name)
		if err == nil && len(got) == 1 && got[0] == addr {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still resolves to %v, %v", name, got, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
