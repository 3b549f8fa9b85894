package system

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"
)

// TestDebUnderSystemd installs the .deb in a container under a real systemd
// and operates it: socket activation, reload, crash and watchdog restarts, an
// upgrade with a report queued, remove and purge.
func TestDebUnderSystemd(t *testing.T) {
	skipRealSystemd(t)
	old, upgrade := packages(t)
	w := newWorld(t)
	c := boot(t, map[string]string{"/mnt/v1": filepath.Dir(old.Deb), "/mnt/v2": filepath.Dir(upgrade.Deb)})
	c.dumpOnFailure()
	debOld := "/mnt/v1/" + filepath.Base(old.Deb)
	debNew := "/mnt/v2/" + filepath.Base(upgrade.Deb)

	// Install: user and directories created, units enabled, only the
	// socket started.
	c.must("dpkg", "-i", debOld)
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
	if got := c.prop(serviceUnit, "ActiveState"); got != "inactive" {
		t.Fatalf("service %s before the first connection, want inactive (socket activation)", got)
	}

	// Point the agent at the stand-in; the service has not started yet,
	// so nothing needs a restart.
	c.writeFile(envPath, w.envFile(), 0o600)
	c.writeFile(confPath, w.testConfig(c.readFile(confPath)), 0o644)
	c.writeFile(caPath, w.caPEM, 0o644)

	// The first connection starts the service, which takes systemd's socket.
	if body := c.waitHealthy(); !strings.Contains(body, `"status":"ok"`) {
		t.Errorf("/health: %s", body)
	}
	if st := c.agent(); st.active != "active" || st.pid == "0" {
		t.Fatalf("service after the first connection: %s", st)
	}
	journal := c.journal(serviceUnit)
	for _, want := range []string{`msg="using socket passed by systemd" name=http addr=127.0.0.1:8090`,
		"msg=templatecenter version=" + old.Version, "msg=ready"} {
		if !strings.Contains(journal, want) {
			t.Errorf("journal lacks %q:\n%s", want, journal)
		}
	}
	if user := strings.TrimSpace(c.must("ps", "-o", "user=", "-p", c.agent().pid)); user != "cube-templatecenter" {
		t.Errorf("agent runs as %q", user)
	}
	// /metrics works inside the sandbox (the process collector reads /proc).
	if code, body, err := get("/metrics"); err != nil || code != 200 || !strings.Contains(body, "cube_templatecenter_jobs_accepted_total") ||
		!strings.Contains(body, "process_start_time_seconds") {
		t.Errorf("/metrics: %d %v\n%.2000s", code, err, body)
	}
	w.submit("deb-first")
	if cb := w.waitTerminal("deb-first"); cb.Field("status") == "BUILT" {
		// The sandboxed agent wrote its artifact into the store, readable
		// by CubeMaster and the nodes.
		stat := strings.TrimSpace(c.must("stat", "-c", "%U %A", cb.Field("ext4_path")))
		if stat != "cube-templatecenter -rw-r--r--" {
			t.Errorf("artifact %s: %s", cb.Field("ext4_path"), stat)
		}
	}
	// The layer cache re-encodes the image's two gzip layers as zstd on its
	// idle-priority thread, inside the unit's sandbox and syscall filter.
	c.waitUntil("the layer cache re-encodes both layers", restartLimit, func() (bool, string) {
		_, body, err := get("/metrics")
		if err != nil {
			return false, err.Error()
		}
		if strings.Contains(body, "cube_templatecenter_layer_cache_transcode_failures_total 0") &&
			strings.Contains(body, "cube_templatecenter_layer_cache_zstd_blobs 2") {
			return true, ""
		}
		var lines []string
		for l := range strings.Lines(body) {
			if strings.HasPrefix(l, "cube_templatecenter_layer_cache_") {
				lines = append(lines, strings.TrimSpace(l))
			}
		}
		return false, strings.Join(lines, "; ")
	})

	// S3-backed: the same service, pointed at a real S3 server on the
	// host, uploads its artifact from inside the unit's sandbox (syscall
	// filter, address restrictions); the same spec resumes on the
	// published image and only uploads.
	srv := s3srv.Get(t)
	env := w.envFile() + s3Env(srv)
	c.writeFile(envPath, env, 0o600)
	c.must("systemctl", "restart", serviceUnit)
	c.waitHealthy()
	w.submit("deb-s3")
	if cb := w.waitTerminal("deb-s3"); cb.Field("status") != "BUILT" || cb.Field("storage_backend") != "s3" || cb.Field("artifact_url") == "" {
		t.Errorf("S3-backed build under systemd: %v", cb.Body)
	} else if info, err := srv.Client().StatObject(context.Background(), srv.Bucket, cb.Field("object_key"), minio.StatObjectOptions{}); err != nil ||
		info.Size != cb.Int("ext4_size_bytes") {
		t.Errorf("object %s: %+v, %v; want %d bytes", cb.Field("object_key"), info, err, cb.Int("ext4_size_bytes"))
	}
	// The rest of the flow keeps the blob store. The starts above count
	// towards the unit's start rate limit, which the crash tests below
	// must not hit: begin them with a clean count, as an operator would.
	c.must("systemctl", "reset-failed", serviceUnit)

	// systemctl reload: SIGHUP, the agent re-reads conf.yaml, same process.
	before := c.agent()
	sighups := strings.Count(c.journal(serviceUnit), `msg="SIGHUP: reloading configuration"`)
	c.writeFile(confPath, strings.Replace(c.readFile(confPath), "level: info", "level: debug", 1), 0o644)
	c.must("systemctl", "reload", serviceUnit)
	// ExecReload= only sends the signal: wait for the agent to act on it.
	c.waitUntil("the agent reloads on SIGHUP", restartLimit, func() (bool, string) {
		journal = c.journal(serviceUnit)
		n := strings.Count(journal, `msg="SIGHUP: reloading configuration"`)
		return n == sighups+1 && strings.Contains(journal, `msg="configuration reloaded" log_level=debug`),
			strconv.Itoa(n) + " SIGHUP reloads logged"
	})
	if after := c.agent(); after.pid != before.pid || after.active != "active" {
		t.Errorf("reload changed the service: before %s, after %s", before, after)
	}
	if status := c.prop(serviceUnit, "StatusText"); !strings.Contains(status, "queued") {
		t.Errorf("StatusText %q: the agent's STATUS= line", status)
	}

	// stop and start as an operator would: stopping the service leaves the
	// socket, whose next connection starts it again; stopping both closes
	// the port; starting the service brings its socket along.
	c.must("systemctl", "stop", serviceUnit)
	if st := c.agent(); st.active != "inactive" || st.result != "success" {
		t.Errorf("after systemctl stop: %s", st)
	}
	if !strings.Contains(c.journal(serviceUnit), "msg=stopped") {
		t.Error("journal shows no graceful stop")
	}
	if got := c.prop(socketUnit, "ActiveState"); got != "active" {
		t.Errorf("socket %s after stopping the service", got)
	}
	c.waitHealthy()
	c.must("systemctl", "stop", socketUnit, serviceUnit)
	if !portClosed() {
		t.Error("port 8090 still open with socket and service stopped")
	}
	c.must("systemctl", "start", serviceUnit)
	if got := c.prop(socketUnit, "ActiveState"); got != "active" {
		t.Errorf("socket %s after systemctl start of the service", got)
	}
	if out, err := c.exec("systemctl", "status", "--no-pager", serviceUnit); err != nil || !strings.Contains(out, "active (running)") {
		t.Errorf("systemctl status: %v\n%s", err, out)
	}
	c.waitHealthy()

	// kill -9 with a terminal report undelivered: systemd restarts the
	// agent by itself and the report arrives exactly once.
	restartWithReportHeld(t, c, w, "deb-crash", "-9", "status=9/KILL")

	// Watchdog: a stopped (SIGSTOP) agent stops pinging and systemd
	// restarts it. A drop-in shortens WatchdogSec to keep the test short.
	c.writeFile("/etc/systemd/system/"+serviceUnit+".d/50-system-test-watchdog.conf", "[Service]\nWatchdogSec=5s\n", 0o644)
	c.must("systemctl", "daemon-reload")
	c.must("systemctl", "restart", serviceUnit)
	if wd := c.prop(serviceUnit, "WatchdogUSec"); wd != "5s" {
		t.Fatalf("WatchdogUSec=%s after the drop-in", wd)
	}
	restartWithReportHeld(t, c, w, "deb-watchdog", "-STOP", "Failed with result 'watchdog'")
	c.must("rm", "/etc/systemd/system/"+serviceUnit+".d/50-system-test-watchdog.conf")
	c.must("systemctl", "daemon-reload")

	// Upgrade with a report queued: the new postinst restarts the agent,
	// the configuration stays as edited, the report is delivered once.
	confBefore := c.readFile(confPath)
	w.hold()
	w.submit("deb-upgrade")
	w.waitRefusedTerminal("deb-upgrade")
	before = c.agent()
	loosenConf(c)
	c.must("dpkg", "-i", debNew)
	checkConfMode(t, c, "after an upgrade from a world-readable one")
	after := c.agent()
	if after.pid == before.pid || after.active != "active" {
		t.Errorf("upgrade did not restart the running agent: before %s, after %s", before, after)
	}
	// The first line of version is the version; revision and Go follow.
	if v, _, _ := strings.Cut(strings.TrimSpace(c.must("templatecenter", "version")), "\n"); v != "templatecenter "+upgrade.Version {
		t.Errorf("after upgrade: %q", v)
	}
	if !strings.Contains(c.journal(serviceUnit), "msg=templatecenter version="+upgrade.Version) {
		t.Errorf("journal shows no start of %s", upgrade.Version)
	}
	if got := c.readFile(confPath); got != confBefore {
		t.Errorf("upgrade changed %s:\n%s", confPath, got)
	}
	if got := c.readFile(envPath); got != env {
		t.Errorf("upgrade changed %s:\n%s", envPath, got)
	}
	w.release()
	w.waitTerminal("deb-upgrade")
	c.waitHealthy()

	// Remove: units stopped and disabled, state, configuration and store
	// kept.
	c.writeFile(storeKeep, "artifact", 0o644)
	c.must("dpkg", "-r", pkgName)
	for _, unit := range []string{socketUnit, serviceUnit} {
		if got := c.prop(unit, "ActiveState"); got != "inactive" {
			t.Errorf("%s %s after remove", unit, got)
		}
		if c.exists("/etc/systemd/system/sockets.target.wants/"+socketUnit) ||
			c.exists("/etc/systemd/system/multi-user.target.wants/"+serviceUnit) {
			t.Errorf("%s still enabled after remove", unit)
		}
	}
	if !portClosed() {
		t.Error("port 8090 still open after remove")
	}
	for _, p := range []string{stateDir + "/spool.db", confPath, envPath, storeKeep} {
		if !c.exists(p) {
			t.Errorf("remove deleted %s", p)
		}
	}

	// Reinstall after remove enables and starts again, with the old state.
	c.must("dpkg", "-i", debNew)
	if got := strings.TrimSpace(c.must("systemctl", "is-enabled", socketUnit)); got != "enabled" {
		t.Errorf("socket %s after reinstall", got)
	}
	c.waitHealthy()
	if out := c.must("templatecenter", "jobs", "-spool", stateDir+"/spool.db"); !strings.Contains(out, "deb-upgrade") {
		t.Errorf("spool lost its jobs across remove and reinstall:\n%s", out)
	}

	// Purge: state, cache and configuration go; the artifact store stays.
	c.must("dpkg", "--purge", pkgName)
	for _, p := range []string{stateDir, cacheDir, "/etc/cube-templatecenter"} {
		if c.exists(p) {
			t.Errorf("purge left %s", p)
		}
	}
	if !c.exists(storeKeep) {
		t.Errorf("purge deleted the artifact store's %s", storeKeep)
	}
	if !portClosed() {
		t.Error("port 8090 still open after purge")
	}
}

// restartWithReportHeld builds jobID while CubeMaster refuses its terminal
// report, sends the agent signal (kill(1) syntax), waits for systemd to
// restart it with journalWant in the unit's journal, then lets CubeMaster
// accept and requires the report delivered exactly once.
func restartWithReportHeld(t *testing.T, c *container, w *world, jobID, signal, journalWant string) {
	t.Helper()
	w.hold()
	w.submit(jobID)
	w.waitRefusedTerminal(jobID)
	before := c.agent()
	c.must("kill", signal, before.pid)
	c.waitRestarted(before)
	if j := c.journal(serviceUnit); !strings.Contains(j, journalWant) {
		t.Errorf("journal lacks %q after kill %s:\n%s", journalWant, signal, j)
	}
	w.release()
	w.waitTerminal(jobID)
}
