package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestAcceptedJobSurvivesKill: a 200 means the job is in the spool, so a
// kill -9 right after it loses nothing; the restarted agent delivers exactly
// one terminal report.
func TestAcceptedJobSurvivesKill(t *testing.T) {
	t.Parallel()
	cm := startCubeMaster(t, testToken)
	// Refuse every report while the first agent lives, so nothing can have
	// been delivered (and be re-delivered) across the kill: the one
	// accepted terminal report must come from the restarted agent.
	cm.Hold()
	h := newHarness(t, cm.URL(), testToken)
	first := h.startAgent("agent (killed)")
	jobs := []string{"kill9-1", "kill9-2", "kill9-3"}
	for _, id := range jobs {
		submit(t, h.baseURL(), testToken, id, unreachableImage)
	}
	first.kill(t)

	for _, id := range jobs {
		if got := h.showJob(id).Job; got.JobID != id {
			t.Fatalf("after kill -9, jobs show %s found job %q", id, got.JobID)
		}
	}
	cm.Release()
	second := h.startAgent("agent (restarted)")
	for _, id := range jobs {
		waitTerminal(t, cm, id)
	}
	waitOutboxEmpty(t, h.baseURL())
	second.stop(t)
	for _, id := range jobs {
		checkOneTerminal(t, cm, id)
		if s := h.showJob(id); !terminalState(s.Job.State) || len(s.Pending) != 0 {
			t.Errorf("job %s after the restarted agent stopped: state %s, %d reports pending; want terminal, none pending",
				id, s.Job.State, len(s.Pending))
		}
	}
}

// TestTerminalReportSurvivesOutageAndRestart: CubeMaster is down while the
// job finishes; the terminal report waits in the spool through a graceful
// stop and a restart, and is delivered once CubeMaster is back.
func TestTerminalReportSurvivesOutageAndRestart(t *testing.T) {
	t.Parallel()
	cm := startCubeMaster(t, testToken)
	cm.Stop()
	h := newHarness(t, cm.URL(), testToken)
	first := h.startAgent("agent (before restart)")
	const id = "outage-1"
	submit(t, h.baseURL(), testToken, id, unreachableImage)
	h.waitShow(id, "a failed delivery of the terminal report", func(s jobShow) bool {
		r, ok := s.terminalPending()
		return terminalState(s.Job.State) && ok && r.Attempts >= 1
	})
	first.stop(t)

	s := h.showJob(id)
	r, ok := s.terminalPending()
	if !ok {
		t.Fatalf("after a graceful stop with CubeMaster down, job %s has no pending terminal report:\n%s", id, s.raw)
	}
	if !strings.Contains(r.LastError, "refused") {
		t.Errorf("pending terminal report last_error = %q, want the connection refusal", r.LastError)
	}

	second := h.startAgent("agent (after restart)")
	if n := len(cm.All()); n != 0 {
		t.Fatalf("the stopped stand-in recorded %d callbacks", n)
	}
	if err := cm.Restart(); err != nil {
		t.Fatal(err)
	}
	cb := waitTerminal(t, cm, id)
	if got, want := strings.ToLower(cb.Field("status")), s.Job.State; got != want {
		t.Errorf("delivered terminal status %s, but the spool recorded the job as %s", cb.Field("status"), want)
	}
	waitOutboxEmpty(t, h.baseURL())
	second.stop(t)
	checkOneTerminal(t, cm, id)
}

// TestGracefulStopKeepsQueuedWork: with one build slot and several accepted
// jobs, SIGTERM exits 0 and the restarted agent ends every job with one
// terminal status: nothing lost, nothing flipped.
func TestGracefulStopKeepsQueuedWork(t *testing.T) {
	t.Parallel()
	cm := startCubeMaster(t, testToken)
	// A registry that takes a while to say "no such image": once the
	// rootfs builder is real, builds of it still run when SIGTERM comes.
	registry := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(500 * time.Millisecond):
		case <-r.Context().Done():
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(registry.Close)
	host := strings.TrimPrefix(registry.URL, "http://")
	image := host + "/blackbox/slow:latest"

	h := newHarness(t, cm.URL(), testToken)
	h.set("build.max_concurrent_builds", 1)
	h.set("registry.insecure", []string{host})
	first := h.startAgent("agent (stopped with queued work)")
	var jobs []string
	for i := range 6 {
		id := fmt.Sprintf("queued-%d", i+1)
		submit(t, h.baseURL(), testToken, id, image)
		jobs = append(jobs, id)
	}
	first.stop(t)
	res := runCLI(t, h.environ(), "jobs", "-json")
	if res.code != 0 {
		t.Fatalf("templatecenter jobs -json: exit %d: %s", res.code, res.stderr)
	}
	var views []jobView
	if err := json.Unmarshal([]byte(res.stdout), &views); err != nil {
		t.Fatalf("templatecenter jobs -json: %v\n%s", err, res.stdout)
	}
	states := map[string]int{}
	for _, v := range views {
		states[v.State]++
	}
	t.Logf("spool after SIGTERM: %v", states)
	if len(views) != len(jobs) || states["running"] != 0 {
		t.Errorf("after a graceful stop the spool holds %d jobs %v, want %d and none running", len(views), states, len(jobs))
	}

	second := h.startAgent("agent (restarted)")
	for _, id := range jobs {
		waitTerminal(t, cm, id)
	}
	waitOutboxEmpty(t, h.baseURL())
	second.stop(t)
	for _, id := range jobs {
		if n := checkConsistentTerminals(t, cm, id); n > 1 {
			t.Logf("job %s: terminal report delivered %d times (at-least-once redelivery)", id, n)
		}
		s := h.showJob(id)
		if got := acceptedTerminals(cm, id); len(got) > 0 && strings.ToLower(got[0].Field("status")) != s.Job.State {
			t.Errorf("job %s: CubeMaster got %s, the spool says %s", id, got[0].Field("status"), s.Job.State)
		}
		if len(s.Pending) != 0 {
			t.Errorf("job %s: %d reports still pending after the outbox drained", id, len(s.Pending))
		}
	}
}
