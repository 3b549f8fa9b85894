package system

import (
	"bytes"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// An upstream install as its one-click installer leaves it: its unit under
// our unit's name in /etc/systemd/system, running as root on port 8090, its
// configuration and environment under /usr/local/services/cubetoolbox, and
// a root-owned store (0711) holding a root-owned artifact.
const (
	upstreamUnitPath = "/etc/systemd/system/" + serviceUnit
	upstreamAside    = "/var/backups/cube-templatecenter-upstream"
	upstreamConf     = "/usr/local/services/cubetoolbox/CubeTemplateCenter/conf.yaml"
	upstreamStart    = "/usr/local/services/cubetoolbox/scripts/systemd/cubetemplatecenter-start.sh"
	upstreamArtifact = "rfs-upstream0000000000000001"
	upstreamBody     = "upstream templatecenter"
)

// upstreamUnit is upstream's unit, trimmed to what matters here.
const upstreamUnit = `[Unit]
Description=Cube Sandbox CubeTemplateCenter
After=network-online.target
ConditionPathExists=/usr/local/services/cubetoolbox/.one-click.env
RequiresMountsFor=/data/CubeMaster/storage

[Service]
Type=simple
User=root
WorkingDirectory=/usr/local/services/cubetoolbox
EnvironmentFile=-/usr/local/services/cubetoolbox/.one-click.env
Environment=CUBE_TEMPLATE_CENTER_CONFIG_PATH=/usr/local/services/cubetoolbox/CubeTemplateCenter/conf.yaml
ExecStart=/usr/bin/bash /usr/local/services/cubetoolbox/scripts/systemd/cubetemplatecenter-start.sh
Restart=on-failure
RestartSec=2s

[Install]
WantedBy=multi-user.target
`

// upstreamStartScript stands in for upstream's binary: it holds the port and
// answers every request with upstreamBody.
const upstreamStartScript = `#!/usr/bin/bash
mkdir -p /data/CubeMaster/storage
exec /usr/bin/perl -MIO::Socket::INET -e '
my $s = IO::Socket::INET->new(LocalAddr => "127.0.0.1:8090", Listen => 16, ReuseAddr => 1) or die "listen: $!";
while (my $c = $s->accept) { while (my $l = <$c>) { last if $l =~ /^\r?\n$/ } print $c "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n` + upstreamBody + `\n"; close $c }'
`

// upstreamConfYAML is an upstream-style conf.yaml (no driver, upstream keys).
const upstreamConfYAML = `common:
  http_bind: 127.0.0.1
  http_port: 8090
  http_readtimeout: 120
  master_addr: http://127.0.0.1:8089
log:
  path: /data/log/CubeTemplateCenter
  level: info
instance_db_config:
  addr: 127.0.0.1:3306
  user: cube
  pwd: cube_pass
  db_name: cube_mvp
`

// setUpUpstream installs and starts the upstream stand-in in c.
func setUpUpstream(t *testing.T, c *container, w *world) {
	t.Helper()
	c.writeFile(oneClickEnv, "CUBE_MASTER_ADDR="+w.cm.URL()+"\nCUBE_TEMPLATE_CALLBACK_TOKEN="+token+"\n", 0o600)
	c.writeFile(upstreamConf, upstreamConfYAML, 0o644)
	c.writeFile(upstreamStart, upstreamStartScript, 0o755)
	c.writeFile(upstreamUnitPath, upstreamUnit, 0o644)
	c.must("install", "-d", "-m", "0711", "-o", "root", "-g", "root", storeDir)
	c.must("install", "-d", "-m", "0755", storeDir+"/"+upstreamArtifact)
	c.writeFile(storeDir+"/"+upstreamArtifact+"/"+upstreamArtifact+".ext4", "an upstream artifact", 0o644)
	c.must("systemctl", "daemon-reload")
	c.must("systemctl", "enable", "--now", serviceUnit)
	c.waitUntil("the upstream stand-in answers on 8090", restartLimit, func() (bool, string) {
		code, body, err := health()
		if err != nil {
			return false, err.Error()
		}
		return code == 200 && strings.Contains(body, upstreamBody), body
	})
}

// upstreamState is what must not change while an install refuses.
func upstreamState(t *testing.T, c *container) string {
	t.Helper()
	_, body, err := health()
	if err != nil {
		t.Fatalf("the upstream stand-in no longer answers: %v", err)
	}
	return strings.Join([]string{
		c.prop(serviceUnit, "MainPID"), c.prop(serviceUnit, "ActiveState"), c.prop(serviceUnit, "FragmentPath"),
		strings.TrimSpace(c.must("systemctl", "is-enabled", serviceUnit)), strings.TrimSpace(body),
		storeState(c), c.readFile(upstreamConf),
		c.must("stat", "-c", "%U:%G %a %n", storeDir+"/"+upstreamArtifact,
			storeDir+"/"+upstreamArtifact+"/"+upstreamArtifact+".ext4"),
	}, "\n")
}

// storeState is the store's owner, mode and ACL.
func storeState(c *container) string {
	return c.must("stat", "-c", "%U:%G %a %n", storeDir) + c.must("getfacl", "-p", "-c", storeDir)
}

// fixCommands are the commands a refusal tells the operator to run.
func fixCommands(t *testing.T, msg string) []string {
	t.Helper()
	_, after, ok := strings.Cut(msg, "run as root:\n")
	if !ok {
		t.Fatalf("the refusal names no commands:\n%s", msg)
	}
	var cmds []string
	for line := range strings.Lines(after) {
		if !strings.HasPrefix(line, "    ") {
			break
		}
		cmds = append(cmds, strings.TrimSpace(line))
	}
	return cmds
}

// deleteArtifact asks the agent to delete an artifact as CubeMaster does.
func deleteArtifact(t *testing.T, id string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, agentURL+"/tc/api/v1/artifact/delete",
		bytes.NewReader([]byte(`{"artifact_id":"`+id+`"}`)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Cube-Template-Callback-Token", token)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("delete %s: %v", id, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// checkTakenOver checks what a take-over leaves: upstream's unit set aside
// and disabled, its configuration in place, the agent serving from the
// store it was granted, and an old root-owned artifact deletable.
func checkTakenOver(t *testing.T, c *container, w *world, jobID string) {
	t.Helper()
	if !c.exists(upstreamAside + "/" + serviceUnit) {
		t.Errorf("upstream's unit not moved to %s", upstreamAside)
	}
	// install.sh puts TC's own unit at the path upstream's had.
	if c.exists(upstreamUnitPath) && strings.Contains(c.readFile(upstreamUnitPath), upstreamStart) {
		t.Errorf("upstream's unit is still in %s", upstreamUnitPath)
	}
	if exec := c.prop(serviceUnit, "ExecStart"); !strings.Contains(exec, "/templatecenter serve") {
		t.Errorf("%s runs %s, not the agent", serviceUnit, exec)
	}
	if c.readFile(upstreamConf) != upstreamConfYAML {
		t.Error("upstream's conf.yaml changed")
	}
	if body := c.waitHealthy(); !strings.Contains(body, `"status":"ok"`) {
		t.Errorf("/health after the take-over: %s", body)
	}
	if user := strings.TrimSpace(c.must("ps", "-o", "user=", "-p", c.agent().pid)); user != "cube-templatecenter" {
		t.Errorf("the agent on the port runs as %q", user)
	}
	// The store keeps its owner; the agent's access is the ACL entry.
	if got := strings.TrimSpace(c.must("stat", "-c", "%U:%G", storeDir)); got != "root:root" {
		t.Errorf("store owner %s after the take-over, want root:root", got)
	}
	if acl := c.must("getfacl", "-p", "-c", storeDir); !strings.Contains(acl, "user:cube-templatecenter:rwx") {
		t.Errorf("store ACL lacks the agent's entry:\n%s", acl)
	}
	w.submit(jobID)
	if cb := w.waitTerminal(jobID); cb.Field("status") != "BUILT" {
		t.Errorf("build into the adopted store: %v", cb.Body)
	}
	if code, body := deleteArtifact(t, upstreamArtifact); code != http.StatusOK {
		t.Errorf("delete of upstream's root-owned artifact: %d %s", code, body)
	}
	if c.exists(storeDir + "/" + upstreamArtifact) {
		t.Error("upstream's artifact still there after its delete")
	}
}

// TestDebOverUpstream installs the .deb over a running upstream install: the
// install refuses with the commands to run and changes nothing; after them
// it installs, serves from the kept store, and deletes an old root-owned
// artifact. A purge and a reinstall leave the store's owner, mode and ACL.
func TestDebOverUpstream(t *testing.T) {
	skipRealSystemd(t)
	old, _ := packages(t)
	w := newWorld(t)
	c := boot(t, map[string]string{"/mnt/v1": filepath.Dir(old.Deb)})
	c.dumpOnFailure()
	deb := "/mnt/v1/" + filepath.Base(old.Deb)
	c.writeFile(caPath, w.caPEM, 0o644)
	setUpUpstream(t, c, w)
	before := upstreamState(t, c)

	_, err := c.exec("dpkg", "-i", deb)
	if err == nil {
		t.Fatal("dpkg -i over a running upstream install succeeded")
	}
	msg := err.Error()
	t.Logf("dpkg -i over upstream: %s", msg)
	for _, want := range []string{
		"an upstream CubeTemplateCenter is in the way; nothing was changed",
		upstreamUnitPath + " is upstream's unit, enabled",
		"port 8090 is held by perl (pid " + c.prop(serviceUnit, "MainPID") + ") of " + serviceUnit,
		"the artifact store " + storeDir + " (root:root 711)",
		"\n    systemctl disable --now " + serviceUnit + "\n",
		"\n    mv " + upstreamUnitPath + " " + upstreamAside + "/\n",
		"\n    systemctl daemon-reload\n",
		"\n    find " + storeDir + " -type d -exec setfacl -m u:cube-templatecenter:rwx {} +\n",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("the refusal lacks %q:\n%s", want, msg)
		}
	}
	if after := upstreamState(t, c); after != before {
		t.Errorf("a refused install changed upstream's service or store:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if c.exists("/usr/bin/templatecenter") {
		t.Error("a refused install unpacked the binary")
	}
	// The .rpm's %pre is the same check.
	c.must("mkdir", "-p", "/var/lib/rpm")
	c.must("rpm", "--dbpath", "/var/lib/rpm", "--initdb")
	if _, err := c.exec("rpm", "--dbpath", "/var/lib/rpm", "-i", "--nodeps", "/mnt/v1/"+filepath.Base(old.RPM)); err == nil {
		t.Error("rpm -i over a running upstream install succeeded")
	} else if !strings.Contains(err.Error(), "an upstream CubeTemplateCenter is in the way; nothing was changed") {
		t.Errorf("rpm's refusal:\n%v", err)
	}
	if after := upstreamState(t, c); after != before || c.exists("/usr/bin/templatecenter") {
		t.Errorf("a refused rpm install changed upstream's service or store:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if out, _ := c.exec("dpkg-query", "-W", "-f=${Status}", pkgName); strings.Contains(out, "installed") && !strings.Contains(out, "not-installed") {
		t.Errorf("package status after the refusal: %q", out)
	}

	// The operator runs what the message says, and installs again.
	for _, cmd := range fixCommands(t, msg) {
		c.must("sh", "-c", cmd)
	}
	c.must("dpkg", "-i", deb)
	c.writeFile(envPath, w.envFile(), 0o600)
	c.writeFile(confPath, w.testConfig(c.readFile(confPath)), 0o644)
	c.must("systemctl", "restart", serviceUnit)
	checkTakenOver(t, c, w, "deb-over-upstream")
	adopted := storeState(c)

	// Purge and reinstall: the store's owner, mode and ACL stay.
	c.must("dpkg", "--purge", pkgName)
	if got := storeState(c); got != adopted {
		t.Errorf("purge changed the store:\nbefore:\n%s\nafter:\n%s", adopted, got)
	}
	// The reinstall goes through deb-systemd-invoke: a policy-rc.d that
	// forbids starting services (an image build) is respected.
	if !portClosed() {
		t.Error("port 8090 still open after purge")
	}
	c.writeFile("/usr/sbin/policy-rc.d", "#!/bin/sh\nexit 101\n", 0o755)
	c.must("dpkg", "-i", deb)
	if got := storeState(c); got != adopted {
		t.Errorf("reinstall changed the store:\nbefore:\n%s\nafter:\n%s", adopted, got)
	}
	if got := strings.TrimSpace(c.must("systemctl", "is-enabled", socketUnit)); got != "enabled" {
		t.Errorf("socket %s after the reinstall", got)
	}
	if got := c.prop(socketUnit, "ActiveState"); got != "inactive" || !portClosed() {
		t.Errorf("socket %s after a reinstall under a policy-rc.d that forbids starts", got)
	}
	c.must("rm", "/usr/sbin/policy-rc.d")
	if c.exists("/etc/systemd/system/" + serviceUnit) {
		t.Error("upstream's unit came back")
	}
}

// TestInstallScriptOverUpstream runs install.sh over a running upstream
// install: without flags it refuses and changes nothing; with --take-over
// and --adopt-store it stops and sets aside upstream's unit, grants the
// agent the store and installs.
func TestInstallScriptOverUpstream(t *testing.T) {
	skipRealSystemd(t)
	old, _ := packages(t)
	w := newWorld(t)
	c := boot(t, map[string]string{"/mnt/src": repoRoot, "/mnt/v1": filepath.Dir(old.Binary)})
	c.dumpOnFailure()
	c.writeFile(caPath, w.caPEM, 0o644)
	setUpUpstream(t, c, w)
	// The older unit name, enabled (a disabled one is left alone).
	oldUnit := "/lib/systemd/system/cube-sandbox-cubetemplatecenter.service"
	c.writeFile(oldUnit, "[Service]\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n", 0o644)
	c.must("systemctl", "daemon-reload")
	c.must("systemctl", "enable", "cube-sandbox-cubetemplatecenter.service")
	before := upstreamState(t, c)

	_, err := c.exec("/mnt/src/install.sh", "--binary", "/mnt/v1/templatecenter")
	if err == nil {
		t.Fatal("install.sh over a running upstream install succeeded")
	}
	for _, want := range []string{"install.sh: an upstream CubeTemplateCenter is in the way; nothing was changed",
		"rerun install.sh with --take-over (units and port) and --adopt-store (the store)",
		oldUnit + " is upstream's unit, enabled: upstream's service would start at boot next to this one"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("install.sh's refusal lacks %q:\n%v", want, err)
		}
	}
	if after := upstreamState(t, c); after != before {
		t.Errorf("a refused install.sh changed upstream's service or store:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if c.exists(installBin) || c.exists(confPath) {
		t.Error("a refused install.sh installed files")
	}

	out := c.must("/mnt/src/install.sh", "--binary", "/mnt/v1/templatecenter", "--take-over", "--adopt-store")
	for _, want := range []string{"+ take over from upstream", "+ systemctl disable --now " + serviceUnit,
		"+ grant cube-templatecenter access to " + storeDir, "keeping the existing " + storeDir + " (root:root 771)",
		"installed templatecenter " + old.Version} {
		if !strings.Contains(out, want) {
			t.Errorf("install.sh --take-over --adopt-store output lacks %q:\n%s", want, out)
		}
	}
	if c.exists(oldUnit) || !c.exists(upstreamAside+"/cube-sandbox-cubetemplatecenter.service") ||
		c.exists("/etc/systemd/system/multi-user.target.wants/cube-sandbox-cubetemplatecenter.service") {
		t.Error("the older upstream unit was not disabled and set aside")
	}
	c.writeFile(confPath, w.testConfig(c.readFile(confPath)), 0o644)
	c.must("systemctl", "restart", serviceUnit)
	checkTakenOver(t, c, w, "sh-over-upstream")
}
