package agent

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// histogram returns the count and sum of the histogram series name with
// label value (or the unlabelled one when label is "") from h's /metrics.
func histogram(t *testing.T, h *harness, name, label, value string) (uint64, float64) {
	t.Helper()
	sel := ""
	if label != "" {
		sel = "{" + label + "=" + strconv.Quote(value) + "}"
	}
	var count uint64
	var sum float64
	for l := range strings.Lines(scrape(t, h)) {
		var err error
		if v, ok := strings.CutPrefix(l, namespace+"_"+name+"_count"+sel+" "); ok {
			count, err = strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		} else if v, ok := strings.CutPrefix(l, namespace+"_"+name+"_sum"+sel+" "); ok {
			sum, err = strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
		if err != nil {
			t.Fatalf("parse %q: %v", l, err)
		}
	}
	return count, sum
}

// TestJobTimings: the phase histogram is labelled with the API's phases and
// times them; a job waiting behind another shows its queue wait; a job
// cancelled in the queue counts in the failed turnaround, with no phase.
func TestJobTimings(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Build.MaxConcurrentBuilds = 1 })
	const resolveDelay = 100 * time.Millisecond
	h.builder.resolveHook = func() { time.Sleep(resolveDelay) }
	entered, release := h.pauseAtPublish()
	h.start()

	h.submit("first", "img-a")
	<-entered
	h.submit("queued", "img-b")
	h.submit("cancelled", "img-c")
	if code, body := h.post("/tc/api/v1/jobs/cancelled/cancel", []byte{}); code != http.StatusOK {
		t.Fatalf("cancel: %d %v", code, body)
	}
	time.Sleep(50 * time.Millisecond)
	close(release)
	h.terminal("first")
	h.terminal("queued")

	if n, sum := histogram(t, h, "build_phase_duration_seconds", "phase", api.PhasePulling); n != 2 || sum < 2*resolveDelay.Seconds() {
		t.Errorf("PULLING: %d observations summing %.3fs, want 2 of at least %v", n, sum, resolveDelay)
	}
	for _, p := range []string{api.PhaseUnpacking, api.PhaseBuildingExt4} {
		if n, _ := histogram(t, h, "build_phase_duration_seconds", "phase", p); n != 2 {
			t.Errorf("%s: %d observations, want 2", p, n)
		}
	}
	for _, old := range []string{"resolve", "build", api.PhaseReady} {
		if n, _ := histogram(t, h, "build_phase_duration_seconds", "phase", old); n != 0 {
			t.Errorf("phase %q observed %d times; labels are the API's phases a job spends time in", old, n)
		}
	}
	n, sum := histogram(t, h, "jobs_queue_wait_seconds", "", "")
	if n != 2 || sum < 0.05 {
		t.Errorf("queue wait: %d observations summing %.3fs, want 2, the second waiting behind the first", n, sum)
	}
	if n, _ := histogram(t, h, "jobs_turnaround_seconds", "result", string(spool.StateBuilt)); n != 2 {
		t.Errorf("built turnaround: %d observations, want 2", n)
	}
	if n, _ := histogram(t, h, "jobs_turnaround_seconds", "result", string(spool.StateFailed)); n != 1 {
		t.Errorf("failed turnaround: %d observations, want 1 (the cancelled job)", n)
	}
}
