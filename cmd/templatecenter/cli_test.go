package main

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// minimalEnv is an environment with nothing for templatecenter to read,
// not even an installed configuration of the host.
func minimalEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), sysconfDirEnv + "=/nonexistent/cube-templatecenter"}
}

func TestCLIVersionAndUsage(t *testing.T) {
	t.Parallel()
	res := runCLI(t, minimalEnv(), "version")
	if want := "templatecenter " + testVersion + "\n"; res.code != 0 || !strings.HasPrefix(res.stdout, want) {
		t.Errorf("templatecenter version = exit %d, stdout %q; want exit 0, first line %q", res.code, res.stdout, want)
	}

	res = runCLI(t, minimalEnv(), "help")
	if res.code != 0 || !strings.Contains(res.stdout, "Usage: templatecenter") {
		t.Errorf("templatecenter help = exit %d, stdout %q; want exit 0 and the usage", res.code, res.stdout)
	}

	res = runCLI(t, minimalEnv(), "frobnicate")
	if res.code != 2 {
		t.Errorf("templatecenter frobnicate: exit code %d, want 2", res.code)
	}
	for _, want := range []string{`unknown command "frobnicate"`, "Usage: templatecenter"} {
		if !strings.Contains(res.stderr, want) {
			t.Errorf("templatecenter frobnicate: stderr does not contain %q:\n%s", want, res.stderr)
		}
	}

	res = runCLI(t, minimalEnv(), "serve", "extra")
	if res.code != 2 || !strings.Contains(res.stderr, "serve: takes no arguments") {
		t.Errorf("templatecenter serve extra = exit %d, stderr %q; want exit 2 and a usage error", res.code, res.stderr)
	}

	res = runCLI(t, minimalEnv(), "jobs", "-no-such-flag")
	if res.code != 2 {
		t.Errorf("templatecenter jobs -no-such-flag: exit code %d, want 2; stderr %q", res.code, res.stderr)
	}
}

// TestJobsCommand inspects the spool of a running agent: the job and its
// undelivered report show, without disturbing the agent.
func TestJobsCommand(t *testing.T) {
	t.Parallel()
	cm := startCubeMaster(t, testToken)
	cm.Hold()
	h := newHarness(t, cm.URL(), testToken)
	p := h.startAgent("agent")
	const id = "inspect-1"
	submit(t, h.baseURL(), testToken, id, unreachableImage)

	// jobs show JOB_ID -spool PATH, while the agent runs.
	s := h.waitShow(id, "a refused terminal report", func(s jobShow) bool {
		r, ok := s.terminalPending()
		return terminalState(s.Job.State) && ok && r.Attempts >= 1
	})
	if s.Job.JobID != id || s.Job.Progress != 100 || s.Job.Phase == "" {
		t.Errorf("jobs show: job = %+v, want %s at progress 100 with its phase", s.Job, id)
	}
	if s.Job.State == "failed" {
		checkFailureReason(t, id, s.Job.Error)
	}
	r, _ := s.terminalPending()
	if got, want := r.Body["status"], strings.ToUpper(s.Job.State); got != want {
		t.Errorf("jobs show: pending terminal report status %v, want %s", got, want)
	}
	if !strings.Contains(r.LastError, "503") {
		t.Errorf("jobs show: pending terminal report last_error = %q, want CubeMaster's 503", r.LastError)
	}
	if strings.Contains(s.raw, registrySecret) {
		t.Errorf("jobs show prints the registry password:\n%s", s.raw)
	}

	// jobs (list) with the spool named by the configuration.
	res := runCLI(t, h.environ(), "jobs")
	if res.code != 0 {
		t.Fatalf("templatecenter jobs: exit %d, stderr %q", res.code, res.stderr)
	}
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "JOB ID") || !strings.Contains(lines[0], "STATE") {
		t.Fatalf("templatecenter jobs: want a header and one job, got:\n%s", res.stdout)
	}
	if f := strings.Fields(lines[1]); len(f) < 2 || f[0] != id || f[1] != s.Job.State {
		t.Errorf("templatecenter jobs: row %q, want job %s in state %s", lines[1], id, s.Job.State)
	}

	res = runCLI(t, h.environ(), "jobs", "-json")
	var views []jobView
	if err := json.Unmarshal([]byte(res.stdout), &views); res.code != 0 || err != nil {
		t.Fatalf("templatecenter jobs -json: exit %d, %v, stdout %q", res.code, err, res.stdout)
	}
	if len(views) != 1 || views[0].JobID != id {
		t.Errorf("templatecenter jobs -json = %+v, want job %s", views, id)
	}

	res = runCLI(t, minimalEnv(), "jobs", "-state", "queued", "-json", "-spool", h.spoolPath)
	if res.code != 0 || strings.TrimSpace(res.stdout) != "[]" {
		t.Errorf("templatecenter jobs -state queued = exit %d, %q; want exit 0, []", res.code, res.stdout)
	}

	res = runCLI(t, minimalEnv(), "jobs", "show", "no-such-job", "-spool", h.spoolPath)
	if res.code != 1 || !strings.Contains(res.stderr, "no-such-job") || !strings.Contains(res.stderr, "not found") {
		t.Errorf("templatecenter jobs show no-such-job = exit %d, stderr %q; want exit 1, not found", res.code, res.stderr)
	}
	res = runCLI(t, minimalEnv(), "jobs", "show", "-spool", h.spoolPath)
	if res.code != 2 {
		t.Errorf("templatecenter jobs show without a job id: exit %d, want 2; stderr %q", res.code, res.stderr)
	}

	// The inspection disturbed nothing: the agent still delivers the
	// report once CubeMaster takes it.
	cm.Release()
	waitTerminal(t, cm, id)
	waitOutboxEmpty(t, h.baseURL())
	p.stop(t)
	checkOneTerminal(t, cm, id)
}

// TestJobsMissingSpool: inspecting a spool that does not exist fails
// clearly and creates nothing.
func TestJobsMissingSpool(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "absent", "spool.db")
	res := runCLI(t, minimalEnv(), "jobs", "-spool", path)
	if res.code != 1 {
		t.Errorf("templatecenter jobs -spool %s: exit code %d, want 1", path, res.code)
	}
	for _, want := range []string{path, "no such file or directory"} {
		if !strings.Contains(res.stderr, want) {
			t.Errorf("templatecenter jobs on a missing spool: stderr does not mention %q:\n%s", want, res.stderr)
		}
	}
	if _, err := os.Stat(filepath.Dir(path)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("templatecenter jobs created %s (stat: %v)", filepath.Dir(path), err)
	}

	// The same through the configuration's spool.path.
	h := newHarness(t, "", testToken)
	h.writeConfig()
	res = runCLI(t, h.environ(), "jobs")
	if res.code != 1 || !strings.Contains(res.stderr, h.spoolPath) {
		t.Errorf("templatecenter jobs with spool.path %s missing = exit %d, stderr %q; want exit 1 naming it", h.spoolPath, res.code, res.stderr)
	}
	if _, err := os.Stat(h.spoolPath); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("templatecenter jobs created %s (stat: %v)", h.spoolPath, err)
	}
}
