package main

// Black-box test of `templatecenter jobs cancel` against a running agent
// whose real builder is held in the middle of a build.

import (
	"net/http"
	"strings"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/test/wait"

	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// TestJobsCancel: `templatecenter jobs cancel ID` asks the running agent,
// with the shared token of the agent's own environment, to cancel a build
// its real builder is writing while the registry holds the image's layers.
// The job ends with one FAILED "cancelled" report and nothing of it in the
// store; the next build succeeds; with the agent stopped the command says
// so; a restart does not resume the cancelled job.
func TestJobsCancel(t *testing.T) {
	t.Parallel()
	cm := startCubeMaster(t, testToken)
	img := cliImage(t)
	config, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	// Layers of blackbox/held never come: the request waits until the
	// agent gives it up.
	reg := images.StartRegistry(t, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if d, ok := images.BlobDigest(r); ok && r.Method == http.MethodGet &&
				strings.Contains(r.URL.Path, "/blackbox/held/") && d != config.String() {
				<-r.Context().Done()
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	held := reg.Push(t, "blackbox/held:v1", img)
	ok := reg.Push(t, "blackbox/ok:v1", img)

	h := newHarness(t, cm.URL(), testToken)
	h.set("registry.insecure", []string{reg.Host})
	store := h.cfg["store"]["dir"].(string)
	p := h.startAgent("agent")
	const id = "cancel-me"
	submit(t, h.baseURL(), testToken, id, held)
	wait.For(t, "a temporary image in the store", func() bool { return len(images.StoreTemps(t, store)) > 0 })

	res := runCLI(t, h.environ(), "jobs", "cancel", id)
	if res.code != 0 || res.stdout != "job "+id+" cancelled\n" {
		t.Fatalf("templatecenter jobs cancel %s = exit %d, stdout %q, stderr %q; want exit 0 and the job cancelled", id, res.code, res.stdout, res.stderr)
	}
	cb := waitTerminal(t, cm, id)
	if cb.Field("status") != "FAILED" || cb.Field("error_message") != "cancelled" || cb.Field("phase") != "BUILDING_EXT4" {
		t.Errorf("cancelled job's terminal report = %v, want FAILED \"cancelled\" in BUILDING_EXT4", cb.Body)
	}
	wait.For(t, "the cancelled build to stop", func() bool {
		v, err := scrapeMetric(h.baseURL(), "cube_templatecenter_jobs_running")
		return err == nil && v == 0
	})
	if left := images.StoreTemps(t, store); len(left) > 0 {
		t.Errorf("the store keeps temporary images of the cancelled build: %v", left)
	}

	res = runCLI(t, h.environ(), "jobs", "cancel", id)
	if res.code != 1 || !strings.Contains(res.stderr, "already finished (failed)") {
		t.Errorf("second jobs cancel = exit %d, stderr %q; want exit 1, already finished (failed)", res.code, res.stderr)
	}
	res = runCLI(t, h.environ(), "jobs", "cancel", "no-such-job")
	if res.code != 1 || !strings.Contains(res.stderr, "no such job") {
		t.Errorf("jobs cancel no-such-job = exit %d, stderr %q; want exit 1, no such job", res.code, res.stderr)
	}
	res = runCLI(t, h.environ("CUBE_TEMPLATE_CALLBACK_TOKEN=not-the-token"), "jobs", "cancel", "no-such-job")
	if res.code != 1 || !strings.Contains(res.stderr, "invalid or missing shared token") {
		t.Errorf("jobs cancel with a wrong token = exit %d, stderr %q; want exit 1, the agent's refusal", res.code, res.stderr)
	}
	res = runCLI(t, h.environ(), "jobs", "cancel")
	if res.code != 2 {
		t.Errorf("jobs cancel without a job id: exit %d, want 2; stderr %q", res.code, res.stderr)
	}

	submit(t, h.baseURL(), testToken, "after-cancel", ok)
	if cb := waitTerminal(t, cm, "after-cancel"); cb.Field("status") != "BUILT" {
		t.Errorf("build after the cancel ended %v, want BUILT", cb.Body)
	}
	waitOutboxEmpty(t, h.baseURL())
	p.stop(t)

	res = runCLI(t, h.environ(), "jobs", "cancel", "after-cancel")
	if res.code != 1 || !strings.Contains(res.stderr, "not running") || !strings.Contains(res.stderr, h.baseURL()) {
		t.Errorf("jobs cancel with the agent stopped = exit %d, stderr %q; want exit 1 saying it is not running at %s", res.code, res.stderr, h.baseURL())
	}

	second := h.startAgent("agent (restarted)")
	waitOutboxEmpty(t, h.baseURL())
	second.stop(t)
	s := h.showJob(id)
	if s.Job.State != "failed" || s.Job.Error != "cancelled" || s.Job.Attempts != 1 {
		t.Errorf("cancelled job after a restart = %+v, want failed \"cancelled\" after its one attempt", s.Job)
	}
	if got := acceptedTerminals(cm, id); len(got) != 1 {
		t.Errorf("cancelled job: %d terminal reports accepted, want 1", len(got))
	}
}
