package system

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestRPMUnderSystemd installs the .rpm with its scriptlets in a container
// under a real systemd (Debian's rpm, with its own database and --nodeps:
// the database knows none of Debian's packages), upgrades it with a report
// queued and erases it.
func TestRPMUnderSystemd(t *testing.T) {
	skipRealSystemd(t)
	old, upgrade := packages(t)
	w := newWorld(t)
	c := boot(t, map[string]string{"/mnt/v1": filepath.Dir(old.RPM), "/mnt/v2": filepath.Dir(upgrade.RPM)})
	c.dumpOnFailure()
	rpm := func(args ...string) string {
		t.Helper()
		return c.must(append([]string{"rpm", "--dbpath", "/var/lib/rpm"}, args...)...)
	}
	c.must("mkdir", "-p", "/var/lib/rpm")
	rpm("--initdb")

	// Install: %post created the user and directories, enabled the units
	// and started the socket only.
	rpm("-i", "--nodeps", "/mnt/v1/"+filepath.Base(old.RPM))
	c.must("getent", "passwd", "cube-templatecenter")
	checkConfMode(t, c, "after install")
	for _, dir := range []string{storeDir, stateDir, cacheDir} {
		if owner := strings.TrimSpace(c.must("stat", "-c", "%U", dir)); owner != "cube-templatecenter" {
			t.Errorf("%s owned by %q", dir, owner)
		}
	}
	for _, unit := range []string{socketUnit, serviceUnit} {
		if got := strings.TrimSpace(c.must("systemctl", "is-enabled", unit)); got != "enabled" {
			t.Errorf("%s is %s after install", unit, got)
		}
	}
	if got := c.prop(socketUnit, "ActiveState"); got != "active" {
		t.Fatalf("socket %s after install", got)
	}
	// Debian's /lib is a link to /usr/lib: systemd may name either.
	if got := c.prop(serviceUnit, "FragmentPath"); strings.TrimPrefix(got, "/usr") != "/lib/systemd/system/"+serviceUnit {
		t.Errorf("service loaded from %s", got)
	}
	c.writeFile(envPath, w.envFile(), 0o600)
	c.writeFile(confPath, w.testConfig(c.readFile(confPath)), 0o644)
	c.writeFile(caPath, w.caPEM, 0o644)
	c.waitHealthy()
	w.submit("rpm-first")
	w.waitTerminal("rpm-first")

	// Upgrade with a report queued: %post restarts the agent, the edited
	// configuration is kept (noreplace), the report arrives once.
	confBefore := c.readFile(confPath)
	w.hold()
	w.submit("rpm-upgrade")
	w.waitRefusedTerminal("rpm-upgrade")
	before := c.agent()
	loosenConf(c)
	rpm("-U", "--nodeps", "/mnt/v2/"+filepath.Base(upgrade.RPM))
	checkConfMode(t, c, "after an upgrade from a world-readable one")
	if after := c.agent(); after.pid == before.pid || after.active != "active" {
		t.Errorf("upgrade did not restart the running agent: before %s, after %s", before, after)
	}
	// The first line of version is the version; revision and Go follow.
	if v, _, _ := strings.Cut(strings.TrimSpace(c.must("templatecenter", "version")), "\n"); v != "templatecenter "+upgrade.Version {
		t.Errorf("after upgrade: %q", v)
	}
	if got := strings.TrimSpace(rpm("-q", pkgName)); !strings.HasPrefix(got, pkgName+"-"+upgrade.Version+"-1.") {
		t.Errorf("rpm -q: %q", got)
	}
	if c.readFile(confPath) != confBefore || c.exists(confPath+".rpmnew") {
		t.Errorf("upgrade touched %s", confPath)
	}
	w.release()
	w.waitTerminal("rpm-upgrade")

	// Erase: %preun stops and disables; rpm has no purge, so the state
	// stays, and the store is never touched.
	c.writeFile(storeKeep, "artifact", 0o644)
	rpm("-e", pkgName)
	for _, unit := range []string{socketUnit, serviceUnit} {
		if got := c.prop(unit, "ActiveState"); got != "inactive" {
			t.Errorf("%s %s after erase", unit, got)
		}
	}
	if c.exists("/etc/systemd/system/sockets.target.wants/" + socketUnit) {
		t.Error("socket still enabled after erase")
	}
	if c.exists("/usr/lib/systemd/system/"+serviceUnit) || c.exists("/usr/bin/templatecenter") {
		t.Error("erase left the unit or the binary")
	}
	if !portClosed() {
		t.Error("port 8090 still open after erase")
	}
	for _, p := range []string{stateDir + "/spool.db", storeKeep} {
		if !c.exists(p) {
			t.Errorf("erase deleted %s", p)
		}
	}
}
