package system

import (
	"path/filepath"
	"strings"
	"testing"
)

const (
	oneClickEnv = "/usr/local/services/cubetoolbox/.one-click.env"
	installBin  = "/usr/local/bin/templatecenter"
)

// TestInstallScriptUnderSystemd runs install.sh in a container under a real
// systemd: a dry run, an install that reuses the one-click environment file,
// a rerun that upgrades in place with a report queued, and uninstall with and
// without --purge.
func TestInstallScriptUnderSystemd(t *testing.T) {
	skipRealSystemd(t)
	old, upgrade := packages(t)
	w := newWorld(t)
	c := boot(t, map[string]string{"/mnt/src": repoRoot,
		"/mnt/v1": filepath.Dir(old.Binary), "/mnt/v2": filepath.Dir(upgrade.Binary)})
	c.dumpOnFailure()
	install := func(args ...string) string {
		t.Helper()
		return c.must(append([]string{"/mnt/src/install.sh"}, args...)...)
	}

	// The one-click installer's environment file holds the address and
	// token, among secrets the agent must not get.
	c.writeFile(oneClickEnv, "# one-click\nexport CUBE_MASTER_ADDR=\""+w.cm.URL()+"\"\nCUBE_SANDBOX_MYSQL_PASSWORD=not-for-tc\n"+
		"CUBE_TEMPLATE_CALLBACK_TOKEN="+token+"\n", 0o600)
	c.writeFile(caPath, w.caPEM, 0o644)

	// A dry run prints the plan and changes nothing.
	out := install("--dry-run", "--binary", "/mnt/v1/templatecenter")
	if !strings.Contains(out, "would: install /mnt/v1/templatecenter as "+installBin) || !strings.Contains(out, "nothing was changed") {
		t.Errorf("dry run output:\n%s", out)
	}
	for _, p := range []string{installBin, "/etc/systemd/system/" + serviceUnit, confPath, stateDir} {
		if c.exists(p) {
			t.Errorf("dry run created %s", p)
		}
	}

	// Install: everything in place, socket enabled and started, /health
	// answered (which started the agent).
	out = install("--binary", "/mnt/v1/templatecenter")
	for _, want := range []string{"taking CUBE_MASTER_ADDR and CUBE_TEMPLATE_CALLBACK_TOKEN from " + oneClickEnv,
		"health: http://127.0.0.1:8090/health answered", "installed templatecenter " + old.Version} {
		if !strings.Contains(out, want) {
			t.Errorf("install.sh output lacks %q:\n%s", want, out)
		}
	}
	checkConfMode(t, c, "after install.sh")
	env := c.readFile(envPath)
	if !strings.Contains(env, "CUBE_MASTER_ADDR=\""+w.cm.URL()+"\"") || !strings.Contains(env, "CUBE_TEMPLATE_CALLBACK_TOKEN=\""+token+"\"") ||
		strings.Contains(env, "MYSQL") {
		t.Errorf("%s:\n%s", envPath, env)
	}
	if mode := strings.TrimSpace(c.must("stat", "-c", "%a %U", envPath)); mode != "600 root" {
		t.Errorf("%s: %s", envPath, mode)
	}
	if !strings.Contains(c.readFile("/etc/systemd/system/"+serviceUnit), "\nExecStart="+installBin+" serve\n") {
		t.Error("installed service does not run " + installBin)
	}
	c.must("getent", "passwd", "cube-templatecenter")
	for _, unit := range []string{socketUnit, serviceUnit} {
		if got := strings.TrimSpace(c.must("systemctl", "is-enabled", unit)); got != "enabled" {
			t.Errorf("%s is %s", unit, got)
		}
		if got := c.prop(unit, "ActiveState"); got != "active" {
			t.Errorf("%s is %s", unit, got)
		}
	}
	c.writeFile(confPath, w.testConfig(c.readFile(confPath)), 0o644)
	c.must("systemctl", "restart", serviceUnit)
	w.submit("sh-first")
	w.waitTerminal("sh-first")

	// Rerun with a newer binary and a report queued: an in-place upgrade
	// that keeps the configuration and the environment file.
	c.writeFile(confPath, c.readFile(confPath)+"\n# edited by the operator\n", 0o644)
	confBefore, envBefore := c.readFile(confPath), c.readFile(envPath)
	w.hold()
	w.submit("sh-upgrade")
	w.waitRefusedTerminal("sh-upgrade")
	before := c.agent()
	loosenConf(c)
	out = install("--binary", "/mnt/v2/templatecenter")
	checkConfMode(t, c, "after install.sh upgraded a world-readable one")
	if !strings.Contains(out, "upgraded in place to templatecenter "+upgrade.Version) || !strings.Contains(out, "keeping the existing "+confPath) {
		t.Errorf("rerun output:\n%s", out)
	}
	if after := c.agent(); after.pid == before.pid || after.active != "active" {
		t.Errorf("rerun did not restart the agent: before %s, after %s", before, after)
	}
	if c.readFile(confPath) != confBefore || c.readFile(envPath) != envBefore {
		t.Errorf("rerun changed the configuration or the environment file")
	}
	w.release()
	w.waitTerminal("sh-upgrade")

	// Uninstall keeps the store, the configuration and the state.
	c.writeFile(storeKeep, "artifact", 0o644)
	out = install("--uninstall")
	if !strings.Contains(out, "uninstalled; kept the artifact store") {
		t.Errorf("uninstall output:\n%s", out)
	}
	for _, p := range []string{installBin, "/etc/systemd/system/" + serviceUnit, "/etc/systemd/system/" + socketUnit,
		"/etc/systemd/system/sockets.target.wants/" + socketUnit} {
		if c.exists(p) {
			t.Errorf("uninstall left %s", p)
		}
	}
	for _, p := range []string{storeKeep, confPath, envPath, stateDir + "/spool.db"} {
		if !c.exists(p) {
			t.Errorf("uninstall deleted %s", p)
		}
	}
	if !portClosed() {
		t.Error("port 8090 still open after uninstall")
	}

	// --purge deletes configuration, state and cache, never the store.
	install("--uninstall", "--purge")
	for _, p := range []string{"/etc/cube-templatecenter", stateDir, cacheDir} {
		if c.exists(p) {
			t.Errorf("purge left %s", p)
		}
	}
	if !c.exists(storeKeep) {
		t.Errorf("purge deleted the store's %s", storeKeep)
	}
}
