package system

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestReloadRefusesBrokenConfig installs the .deb, lets the agent serve,
// then breaks conf.yaml: `systemctl reload` must fail (ExecReload= runs
// `templatecenter check-config` before the signal), the journal must say
// why, and the agent must keep its process and keep serving; the agent's
// own file watcher refuses the file too, which the
// config_last_reload_successful gauge shows. A fixed file reloads again.
func TestReloadRefusesBrokenConfig(t *testing.T) {
	skipRealSystemd(t)
	pkg, _ := packages(t)
	w := newWorld(t)
	c := boot(t, map[string]string{"/mnt/v1": filepath.Dir(pkg.Deb)})
	c.dumpOnFailure()
	c.must("dpkg", "-i", "/mnt/v1/"+filepath.Base(pkg.Deb))
	c.writeFile(envPath, w.envFile(), 0o600)
	good := w.testConfig(c.readFile(confPath))
	c.writeFile(confPath, good, 0o644)
	c.writeFile(caPath, w.caPEM, 0o644)
	c.waitHealthy()
	before := c.agent()
	if before.active != "active" || before.pid == "0" {
		t.Fatalf("service before the reload: %s", before)
	}
	if !gaugeIs("cube_templatecenter_config_last_reload_successful", "1") {
		t.Error("config_last_reload_successful is not 1 after a good start")
	}

	// A value that does not validate: the file still parses, so only the
	// check can refuse it.
	broken := strings.Replace(good, "progress_attempts: 2", "progress_attempts: 0", 1)
	if broken == good {
		t.Fatal("the test configuration lost its progress_attempts line")
	}
	c.writeFile(confPath, broken, 0o644)
	out, err := c.exec("systemctl", "reload", serviceUnit)
	if err == nil {
		t.Errorf("systemctl reload with an invalid conf.yaml exited 0: %s", out)
	}
	journal := c.journal(serviceUnit)
	if !strings.Contains(journal, "master.progress_attempts") || !strings.Contains(journal, "is invalid") {
		t.Errorf("the journal does not say why the reload failed:\n%s", journal)
	}
	if after := c.agent(); after.pid != before.pid || after.active != "active" || after.subState != "running" {
		t.Errorf("a refused reload changed the service: before %s, after %s", before, after)
	}
	c.waitHealthy()
	// The agent watches the file: it saw the broken one too and refused it.
	c.waitUntil("the agent refuses the broken file it watches", restartLimit, func() (bool, string) {
		return gaugeIs("cube_templatecenter_config_last_reload_successful", "0"), "gauge not 0"
	})

	// Fixed, the reload goes through and the agent applies it.
	c.writeFile(confPath, strings.Replace(good, "level: info", "level: debug", 1), 0o644)
	c.must("systemctl", "reload", serviceUnit)
	c.waitUntil("the agent applies the fixed file", restartLimit, func() (bool, string) {
		return strings.Contains(c.journal(serviceUnit), `msg="configuration reloaded" log_level=debug`) &&
			gaugeIs("cube_templatecenter_config_last_reload_successful", "1"), "not yet"
	})
	if after := c.agent(); after.pid != before.pid || after.active != "active" {
		t.Errorf("the reload changed the service: before %s, after %s", before, after)
	}
}

// gaugeIs reports whether /metrics shows the series name with value.
func gaugeIs(name, value string) bool {
	_, body, err := get("/metrics")
	if err != nil {
		return false
	}
	for l := range strings.Lines(body) {
		if strings.TrimSpace(l) == name+" "+value {
			return true
		}
	}
	return false
}
