package system

import (
	"net"
	"slices"
	"strings"
	"testing"
	"time"
)

// A local user's listener on port 8090, waiting for an operator to take the
// machine over from upstream. Any user with a delegated cgroup subtree
// (every systemd user session, user@UID.service) names its cgroups as they
// like; upstream-check.sh runs as root.
const (
	checkScript  = "/mnt/src/packaging/upstream-check.sh"
	hostileUser  = "mallory"
	hostileStart = "/usr/local/bin/hostile-listen"
	// pwned is the file a cgroup's name must never get root to create.
	pwned = "/tmp/PWNED"
	// pwnCgroup is a cgroup name that is a shell command touching pwned.
	// A name cannot hold a "/", so printf spells it.
	pwnCgroup = `x;touch $(printf '\057tmp\057PWNED');#.service`
)

// hostileStartScript starts a listener on $2:8090 from a child of its own
// (delegated) cgroup v2 named as the file $1 says, moving itself there
// first; $3, if given, is its process name (comm). The container has cgroup v2 at /sys/fs/cgroup, or beside v1 at
// /sys/fs/cgroup/unified (a hybrid host).
const hostileStartScript = `#!/bin/sh
set -e
root=/sys/fs/cgroup
[ "$(stat -fc %T "$root")" = cgroup2fs ] || root=$root/unified
cg=$root$(sed -n 's/^0:://p' /proc/self/cgroup)/$(cat "$1")
mkdir "$cg"
echo $$ >"$cg/cgroup.procs"
exec perl -MIO::Socket::IP -e '
$0 = $ARGV[1] if defined $ARGV[1];
my $s = IO::Socket::IP->new(LocalHost => $ARGV[0], LocalPort => 8090, Listen => 16, ReuseAddr => 1) or die "listen: $@";
while (my $c = $s->accept) { close $c }' "$2" ${3+"$3"}
`

// hostileListener starts, as the unprivileged hostileUser, a listener on
// host:8090 in a cgroup named name, and returns its PID and the cgroup's
// path; comm, if given, is its process name. The user's subtree is a
// transient service's with Delegate=yes: the same delegation systemd gives
// every user manager.
func hostileListener(t *testing.T, c *container, unit, name, host string, comm ...string) (pid, cgroup string) {
	t.Helper()
	if _, err := c.exec("id", hostileUser); err != nil {
		c.must("useradd", "--no-create-home", hostileUser)
		c.writeFile(hostileStart, hostileStartScript, 0o755)
	}
	nameFile := "/run/" + unit + ".cgroup-name"
	c.writeFile(nameFile, name, 0o644)
	c.must(append([]string{"systemd-run", "--unit=" + unit, "-p", "Delegate=yes", "-p", "User=" + hostileUser,
		hostileStart, nameFile, host}, comm...)...)
	addr := net.JoinHostPort(host, "8090")
	c.waitUntil("the hostile listener answers on "+addr, time.Minute, func() (bool, string) {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false, err.Error() + "\n" + c.must("systemctl", "status", "--no-pager", unit)
		}
		conn.Close()
		return true, ""
	})
	pid = c.prop(unit, "MainPID")
	for line := range strings.Lines(c.must("cat", "/proc/"+pid+"/cgroup")) {
		if rest, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "0::"); ok {
			cgroup = rest
		}
	}
	if want := "/system.slice/" + unit + "/" + name; cgroup != want {
		t.Fatalf("the hostile listener (pid %s) is in cgroup %q, want %q", pid, cgroup, want)
	}
	return pid, cgroup
}

// portFree tells whether nothing listens on host:8090 within limit.
func portFree(host string, limit time.Duration) bool {
	addr := net.JoinHostPort(host, "8090")
	for deadline := time.Now().Add(limit); ; time.Sleep(200 * time.Millisecond) {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return true
		}
		conn.Close()
		if time.Now().After(deadline) {
			return false
		}
	}
}

// endHostile checks that what the last step ran stopped the listener of
// unit, then stops it anyway, so that the next step starts afresh.
func endHostile(t *testing.T, c *container, unit, host string) {
	t.Helper()
	if !portFree(host, 10*time.Second) {
		t.Errorf("the listener of %s still holds port 8090", unit)
	}
	c.exec("systemctl", "stop", unit) // an error: it is gone already
	if !portFree(host, time.Minute) {
		t.Fatalf("port 8090 still busy after systemctl stop %s", unit)
	}
}

// checkNotPwned fails the test if pwned exists, and removes it so that the
// next step is judged on its own.
func checkNotPwned(t *testing.T, c *container, step string) {
	t.Helper()
	if c.exists(pwned) {
		t.Errorf("%s ran the command in the cgroup's name: %s exists", step, pwned)
		c.must("rm", "-f", pwned)
	}
}

// checkUnknownHolder checks a refusal for a holder that is not a systemd
// service: named as an unknown process, and only a kill of its PID to run.
func checkUnknownHolder(t *testing.T, msg, pid, cgroup, name string) {
	t.Helper()
	want := "port 8090 is held by perl (pid " + pid + "), not a systemd service: an unknown process in cgroup " + cgroup + "\n"
	if !strings.Contains(msg, want) {
		t.Errorf("the refusal lacks %q:\n%s", want, msg)
	}
	cmds := fixCommands(t, msg)
	if want := []string{"kill " + pid}; !slices.Equal(cmds, want) {
		t.Errorf("the refusal's commands are %q, want %q", cmds, want)
	}
	for _, cmd := range cmds {
		if strings.Contains(cmd, "systemctl") || strings.Contains(cmd, name) {
			t.Errorf("the refusal's command %q acts on the cgroup's name", cmd)
		}
	}
}

// TestTakeOverHostileCgroupName puts a listener on the port in a cgroup
// named as a shell command: neither the check's report, nor the commands
// it prints (run as the operator would, with sh -c), nor its take-over
// (directly and from install.sh --take-over) runs it. The holder is an
// unknown process, and the take-over kills it by PID.
func TestTakeOverHostileCgroupName(t *testing.T) {
	skipRealSystemd(t)
	c := boot(t, map[string]string{"/mnt/src": repoRoot})
	c.dumpOnFailure()

	// The check the packages run as their preinst, on [::1] (tcp6).
	pid, cgroup := hostileListener(t, c, "hostile-a.service", pwnCgroup, "::1")
	_, err := c.exec("sh", checkScript, "install")
	if err == nil {
		t.Fatal("the check passed with a listener on port 8090")
	}
	msg := err.Error()
	t.Logf("the check's refusal: %s", msg)
	checkNotPwned(t, c, "the check")
	checkUnknownHolder(t, msg, pid, cgroup, pwnCgroup)
	// The operator runs what the refusal says.
	for _, cmd := range fixCommands(t, msg) {
		if _, err := c.exec("sh", "-c", cmd); err != nil {
			t.Errorf("the refusal's command %q: %v", cmd, err)
		}
	}
	checkNotPwned(t, c, "running the refusal's commands")
	endHostile(t, c, "hostile-a.service", "::1")

	// The take-over runs the commands itself, on 127.0.0.1 this time.
	pid, _ = hostileListener(t, c, "hostile-b.service", pwnCgroup, "127.0.0.1")
	out, err := c.exec("sh", "-c", "sh "+checkScript+" take-over 2>&1")
	t.Logf("take-over: %s", out)
	if err != nil {
		t.Errorf("take-over: %v", err)
	}
	checkNotPwned(t, c, "the take-over")
	if want := "+ kill " + pid + "\n"; out != want {
		t.Errorf("take-over ran %q, want only %q", out, want)
	}
	endHostile(t, c, "hostile-b.service", "127.0.0.1")

	// The documented migration: install.sh --take-over (no binary is
	// started: --no-start).
	pid, _ = hostileListener(t, c, "hostile-c.service", pwnCgroup, "::1")
	out, err = c.exec("sh", "-c", "/mnt/src/install.sh --binary /bin/true --take-over --no-start 2>&1")
	t.Logf("install.sh --take-over: %s", out)
	if err != nil {
		t.Errorf("install.sh --take-over: %v", err)
	}
	checkNotPwned(t, c, "install.sh --take-over")
	if want := "\n+ kill " + pid + "\n"; !strings.Contains(out, want) {
		t.Errorf("install.sh --take-over's output lacks %q", want)
	}
	if strings.Contains(out, "+ systemctl disable") {
		t.Error("install.sh --take-over disabled a unit")
	}
	endHostile(t, c, "hostile-c.service", "::1")
}

// TestTakeOverCgroupNamedAfterUnit puts a listener on the port in a cgroup
// named after a real, running, enabled unit: that unit is not the holder,
// so the check names no unit and the take-over leaves it running and
// enabled.
func TestTakeOverCgroupNamedAfterUnit(t *testing.T) {
	skipRealSystemd(t)
	c := boot(t, map[string]string{"/mnt/src": repoRoot})
	c.dumpOnFailure()
	const precious = "precious.service"
	c.writeFile("/etc/systemd/system/"+precious,
		"[Unit]\nDescription=a service the take-over must leave alone\n[Service]\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n", 0o644)
	c.must("systemctl", "daemon-reload")
	c.must("systemctl", "enable", "--now", precious)
	mainPID := c.prop(precious, "MainPID")

	pid, cgroup := hostileListener(t, c, "hostile.service", precious, "127.0.0.1")
	_, err := c.exec("sh", checkScript, "install")
	if err == nil {
		t.Fatal("the check passed with a listener on port 8090")
	}
	msg := err.Error()
	t.Logf("the check's refusal: %s", msg)
	checkUnknownHolder(t, msg, pid, cgroup, precious)

	out, err := c.exec("sh", "-c", "sh "+checkScript+" take-over 2>&1")
	t.Logf("take-over: %s", out)
	if err != nil {
		t.Errorf("take-over: %v", err)
	}
	if want := "+ kill " + pid + "\n"; out != want {
		t.Errorf("take-over ran %q, want only %q", out, want)
	}
	endHostile(t, c, "hostile.service", "127.0.0.1")
	if got := c.show(precious, "ActiveState", "MainPID"); got["ActiveState"] != "active" || got["MainPID"] != mainPID {
		t.Errorf("%s after the take-over: %v, want active with MainPID %s", precious, got, mainPID)
	}
	if got, _ := c.exec("systemctl", "is-enabled", precious); strings.TrimSpace(got) != "enabled" {
		t.Errorf("%s is %q after the take-over, want enabled", precious, strings.TrimSpace(got))
	}
}

// TestTakeOverReportShowsNamesSafely puts a listener on the port whose
// process and cgroup names carry terminal control sequences, the cgroup's
// as long as the kernel allows: the report shows both as printable ASCII,
// the cgroup's cut short.
func TestTakeOverReportShowsNamesSafely(t *testing.T) {
	skipRealSystemd(t)
	c := boot(t, map[string]string{"/mnt/src": repoRoot})
	c.dumpOnFailure()
	name := "evil\x1b[2J\a" + strings.Repeat("y", 230) + ".service"
	pid, _ := hostileListener(t, c, "hostile.service", name, "127.0.0.1", "\x1b[31mred")
	_, err := c.exec("sh", checkScript, "install")
	if err == nil {
		t.Fatal("the check passed with a listener on port 8090")
	}
	msg := err.Error()
	t.Logf("the check's refusal: %q", msg)
	if strings.ContainsAny(msg, "\x1b\a") {
		t.Error("the refusal passes on control characters")
	}
	cgroup := "/system.slice/hostile.service/evil?[2J?" + strings.Repeat("y", 200-len("/system.slice/hostile.service/evil?[2J?"))
	if want := "port 8090 is held by ?[31mred (pid " + pid + "), not a systemd service: an unknown process in cgroup " + cgroup + "...\n"; !strings.Contains(msg, want) {
		t.Errorf("the refusal lacks %q:\n%s", want, msg)
	}
	if cmds, want := fixCommands(t, msg), []string{"kill " + pid}; !slices.Equal(cmds, want) {
		t.Errorf("the refusal's commands are %q, want %q", cmds, want)
	}
}
