package agent

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/spool"
	"github.com/cubesandbox/cubetemplatecenter/test/cubemaster"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// cancelJob asks the agent to cancel job id, with the test token.
func (h *harness) cancelJob(id string) (int, map[string]any) {
	h.t.Helper()
	return h.post("/tc/api/v1/jobs/"+id+"/cancel", []byte{})
}

// setWhileWriting replaces the builder's hook that holds a build with its
// temporary image written.
func (h *harness) setWhileWriting(hook func(ctx context.Context, spec rootfs.Spec, temp string) error) {
	h.builder.mu.Lock()
	h.builder.whileWriting = hook
	h.builder.mu.Unlock()
}

// waitIdle waits until the agent runs no job and no build, so whatever a
// stopped build had to remove is removed.
func (h *harness) waitIdle() {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		running, flights := h.agent.exec.Busy()
		if running == 0 && flights == 0 {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("agent still has %d jobs running and %d builds in flight", running, flights)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitOutboxEmpty waits until every report was delivered.
func (h *harness) waitOutboxEmpty() {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := h.sp.OutboxDepth(context.Background())
		if err == nil && n == 0 {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("outbox holds %d reports (%v)", n, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// checkCancelled requires job id to have ended with exactly one terminal
// report, FAILED "cancelled" in phase, once the outbox is empty, and the
// spool to agree.
func checkCancelled(t *testing.T, h *harness, id, phase string) {
	t.Helper()
	cb := h.terminal(id)
	if cb.Field("status") != "FAILED" || cb.Field("error_message") != "cancelled" || cb.Field("phase") != phase {
		t.Errorf("job %s ended %v, want FAILED %q in phase %s", id, cb.Body, "cancelled", phase)
	}
	h.waitOutboxEmpty()
	var terminals []cubemaster.Callback
	cbs := h.master.Callbacks(id)
	for _, c := range cbs {
		if c.Terminal() {
			terminals = append(terminals, c)
		}
	}
	if len(terminals) != 1 {
		t.Errorf("job %s: %d terminal reports, want 1: %v", id, len(terminals), statusPhases(cbs))
	}
	if len(cbs) > 0 && !cbs[len(cbs)-1].Terminal() {
		t.Errorf("job %s: a report followed the terminal one: %v", id, statusPhases(cbs))
	}
	j, err := h.sp.Job(context.Background(), id)
	if err != nil || j.State != spool.StateFailed || j.Error != "cancelled" {
		t.Errorf("job %s in the spool = %+v (%v), want failed \"cancelled\"", id, j, err)
	}
}

// checkCancelAnswer requires a 200 {"status":"cancelled","job_id":id}.
func checkCancelAnswer(t *testing.T, id string, code int, body map[string]any) {
	t.Helper()
	if code != http.StatusOK || body["status"] != "cancelled" || body["job_id"] != id {
		t.Fatalf("cancel %s = %d %v, want 200 {status:cancelled job_id:%s}", id, code, body, id)
	}
}

// receive waits for one value from ch.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s within 10s", what)
		var zero T
		return zero
	}
}

// TestCancelQueuedJob: a job waiting for a slot is cancelled at once, never
// runs, and ends with its one FAILED report while the running build goes
// on; a second cancel is refused with its state.
func TestCancelQueuedJob(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Build.MaxConcurrentBuilds = 1 })
	entered, release := make(chan string, 4), make(chan struct{})
	h.setWhileWriting(func(ctx context.Context, spec rootfs.Spec, temp string) error {
		entered <- spec.ArtifactID
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	h.start()
	h.submit("holder", "img-holder")
	receive(t, entered, "held build")
	h.submit("waiting", "img-waiting")
	h.waitJob("waiting", spool.StateQueued)

	code, body := h.cancelJob("waiting")
	checkCancelAnswer(t, "waiting", code, body)
	if j, err := h.sp.Job(context.Background(), "waiting"); err != nil || j.State != spool.StateFailed || j.Attempts != 0 {
		t.Errorf("cancelled queued job = %+v (%v), want failed and never started", j, err)
	}
	close(release)
	if cb := h.terminal("holder"); cb.Field("status") != "BUILT" {
		t.Errorf("running job ended %v after a cancel of another, want BUILT", cb.Body)
	}
	checkCancelled(t, h, "waiting", api.PhasePulling)
	if cbs := h.master.Callbacks("waiting"); len(cbs) != 1 {
		t.Errorf("cancelled queued job sent %v, want only its terminal report", statusPhases(cbs))
	}
	if n := h.builder.buildCount(); n != 1 {
		t.Errorf("builds = %d, want 1: the cancelled job must not be built", n)
	}

	code, body = h.cancelJob("waiting")
	if code != http.StatusConflict || body["state"] != "failed" {
		t.Errorf("second cancel = %d %v, want 409 with state failed", code, body)
	}
	metrics := scrape(t, h)
	for _, want := range []string{"cube_templatecenter_jobs_cancelled_total 1",
		`cube_templatecenter_jobs_finished_total{result="failed"} 1`, `cube_templatecenter_jobs_finished_total{result="built"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestCancelRunningJob: a running build is stopped, its temporary image
// removed, the job FAILED "cancelled" in the phase it was in and never
// requeued; the next build of the same image succeeds.
func TestCancelRunningJob(t *testing.T) {
	h := newHarness(t, nil)
	temps := make(chan string, 1)
	h.setWhileWriting(func(ctx context.Context, spec rootfs.Spec, temp string) error {
		temps <- temp
		<-ctx.Done()
		return ctx.Err()
	})
	h.start()
	h.submit("running", "img")
	temp := receive(t, temps, "build writing its image")
	if _, err := os.Stat(temp); err != nil {
		t.Fatalf("the held build has no temporary image: %v", err)
	}

	code, body := h.cancelJob("running")
	checkCancelAnswer(t, "running", code, body)
	checkCancelled(t, h, "running", api.PhaseBuildingExt4)
	h.waitIdle()
	if _, err := os.Stat(temp); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("temporary image of the cancelled build: %v, want it removed", err)
	}
	if left := images.StoreTemps(h.t, h.cfg.Store.Dir); len(left) > 0 {
		t.Errorf("store holds temporary images after the cancel: %v", left)
	}
	if j := h.waitJob("running", spool.StateFailed); j.Attempts != 1 {
		t.Errorf("cancelled job attempts = %d, want 1", j.Attempts)
	}
	if m := scrape(t, h); !strings.Contains(m, "cube_templatecenter_jobs_cancelled_total 1") ||
		!strings.Contains(m, "cube_templatecenter_jobs_interrupted_total 0") {
		t.Errorf("metrics after a cancel: want cancelled 1 and interrupted 0")
	}

	h.setWhileWriting(nil)
	h.submit("after", "img")
	if cb := h.terminal("after"); cb.Field("status") != "BUILT" {
		t.Errorf("build after a cancel ended %v, want BUILT", cb.Body)
	}
}

// sharedBuild starts two jobs of one image, held in their one build with
// the temporary image written, and returns which job leads the build and
// which waits for it. ended receives when the build's context ends.
func sharedBuild(t *testing.T, h *harness, a, b, image string, release <-chan struct{}) (leader, follower, temp string, ended <-chan struct{}) {
	t.Helper()
	temps, done := make(chan string, 2), make(chan struct{}, 2)
	h.setWhileWriting(func(ctx context.Context, spec rootfs.Spec, temp string) error {
		temps <- temp
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			done <- struct{}{}
			return ctx.Err()
		}
	})
	h.start()
	h.submit(a, image)
	h.submit(b, image)
	temp = receive(t, temps, "shared build writing its image")
	waitLogged(t, h, "identical build in flight, waiting for it", 1)
	leader, follower = a, b
	if line, ok := findLogLine(h.logs.String(), "identical build in flight"); ok && strings.Contains(line, "job_id="+a+" ") {
		leader, follower = b, a
	}
	return leader, follower, temp, done
}

// findLogLine returns the first line of logs holding sub.
func findLogLine(logs, sub string) (string, bool) {
	for line := range strings.Lines(logs) {
		if strings.Contains(line, sub) {
			return line, true
		}
	}
	return "", false
}

// TestCancelEveryJobOfSharedBuild: cancelling the waiting job leaves the
// build to the other; cancelling that one too, the last that wants it,
// stops the build and removes its temporary image.
func TestCancelEveryJobOfSharedBuild(t *testing.T) {
	h := newHarness(t, nil)
	release := make(chan struct{})
	defer close(release)
	leader, follower, temp, ended := sharedBuild(t, h, "pair-a", "pair-b", "pair-image", release)

	code, body := h.cancelJob(follower)
	checkCancelAnswer(t, follower, code, body)
	checkCancelled(t, h, follower, api.PhaseUnpacking)
	select {
	case <-ended:
		t.Fatal("the build stopped when the job waiting for it was cancelled, though its leader still wants it")
	default:
	}
	if j, err := h.sp.Job(context.Background(), leader); err != nil || j.State != spool.StateRunning {
		t.Errorf("leader after the follower's cancel = %+v (%v), want still running", j, err)
	}

	code, body = h.cancelJob(leader)
	checkCancelAnswer(t, leader, code, body)
	checkCancelled(t, h, leader, api.PhaseBuildingExt4)
	receive(t, ended, "end of the build nobody wants")
	h.waitIdle()
	if _, err := os.Stat(temp); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("temporary image of the abandoned build: %v, want it removed", err)
	}
	if n := h.builder.buildCount(); n != 1 {
		t.Errorf("builds = %d, want 1", n)
	}
}

// TestCancelAnswers: a finished job is refused with its state, an unknown
// one is 404, and the route needs the shared token.
func TestCancelAnswers(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	h.submit("done", "img")
	h.terminal("done")
	h.waitJob("done", spool.StateBuilt)
	code, body := h.cancelJob("done")
	if code != http.StatusConflict || body["state"] != "built" || !strings.Contains(body["error"].(string), "already finished") {
		t.Errorf("cancel of a built job = %d %v, want 409 naming state built", code, body)
	}
	if code, body := h.cancelJob("nope"); code != http.StatusNotFound || body["error"] != "job not found" {
		t.Errorf("cancel of an unknown job = %d %v, want 404", code, body)
	}
	for _, token := range []string{"", "wrong-token"} {
		if code, body := h.postWithToken("/tc/api/v1/jobs/done/cancel", []byte{}, token); code != http.StatusUnauthorized {
			t.Errorf("cancel with token %q = %d %v, want 401", token, code, body)
		}
	}
	if j := h.waitJob("done", spool.StateBuilt); j.Error != "" {
		t.Errorf("refused cancels changed the job: %+v", j)
	}
	if cbs := h.master.Callbacks("done"); !cbs[len(cbs)-1].Terminal() || cbs[len(cbs)-1].Field("status") != "BUILT" {
		t.Errorf("refused cancels sent reports: %v", statusPhases(cbs))
	}
}

// TestBuildTimeout: builds that never finish end FAILED with the timeout
// in their message, the job waiting for the identical build too, with
// nothing left in the store and nothing requeued; with the limit raised
// again, the next build succeeds.
func TestBuildTimeout(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Build.Timeout = 200 * time.Millisecond })
	h.setWhileWriting(func(ctx context.Context, spec rootfs.Spec, temp string) error {
		<-ctx.Done()
		return ctx.Err()
	})
	h.start()
	h.submit("slow-a", "slow")
	h.submit("slow-b", "slow")
	for _, id := range []string{"slow-a", "slow-b"} {
		cb := h.terminal(id)
		if cb.Field("status") != "FAILED" || cb.Field("error_message") != "build exceeded build.timeout (200ms)" ||
			cb.Field("phase") == "" || cb.Field("phase") == api.PhaseReady {
			t.Errorf("job %s ended %v, want FAILED %q in the phase it was in", id, cb.Body, "build exceeded build.timeout (200ms)")
		}
		t.Logf("job %s timed out in %s", id, cb.Field("phase"))
	}
	h.waitIdle()
	h.waitOutboxEmpty()
	if left := images.StoreTemps(h.t, h.cfg.Store.Dir); len(left) > 0 {
		t.Errorf("store holds temporary images after the timeouts: %v", left)
	}
	for _, id := range []string{"slow-a", "slow-b"} {
		if j := h.waitJob(id, spool.StateFailed); !strings.Contains(j.Error, "build.timeout") {
			t.Errorf("job %s in the spool = %+v", id, j)
		}
	}
	if m := scrape(t, h); !strings.Contains(m, "cube_templatecenter_jobs_timed_out_total 2") ||
		!strings.Contains(m, "cube_templatecenter_jobs_interrupted_total 0") {
		t.Errorf("metrics after two timeouts: want timed_out 2 and interrupted 0")
	}

	h.stop()
	h.cfg.Build.Timeout = config.Default().Build.Timeout
	h.setWhileWriting(nil)
	h.start()
	h.submit("quick", "slow")
	if cb := h.terminal("quick"); cb.Field("status") != "BUILT" {
		t.Errorf("build after the timeouts ended %v, want BUILT", cb.Body)
	}
	for _, id := range []string{"slow-a", "slow-b"} {
		if j := h.waitJob(id, spool.StateFailed); j.Attempts != 1 {
			t.Errorf("timed-out job %s was resumed after restart: attempts %d", id, j.Attempts)
		}
	}
}

// TestCancelSurvivesRestart: the 200 to a cancel means the job is failed
// on disk even while its build has not noticed yet. The agent then stops
// without the build ending (as in a crash): the next start removes the
// build's temporary image and never builds the job again.
func TestCancelSurvivesRestart(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Shutdown.Timeout = time.Second })
	temps, release := make(chan string, 1), make(chan struct{})
	h.setWhileWriting(func(ctx context.Context, spec rootfs.Spec, temp string) error {
		temps <- temp
		<-release // deaf to ctx: the build does not notice the cancel
		return errors.New("released by the test")
	})
	h.start()
	h.submit("doomed", "img")
	temp := receive(t, temps, "build writing its image")
	code, body := h.cancelJob("doomed")
	checkCancelAnswer(t, "doomed", code, body)

	ro, err := spool.OpenReadOnly(context.Background(), h.cfg.Spool.Path)
	if err != nil {
		t.Fatal(err)
	}
	j, err := ro.Job(context.Background(), "doomed")
	ro.Close()
	if err != nil || j.State != spool.StateFailed || j.Error != "cancelled" {
		t.Fatalf("spool file after the 200, build still running = %+v (%v), want failed \"cancelled\"", j, err)
	}

	old := h.agent
	h.stop() // gives up waiting for the deaf build after shutdown.timeout
	defer func() {
		close(release)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := old.exec.Wait(ctx); err != nil {
			t.Errorf("released build of the stopped agent: %v", err)
		}
	}()
	h.setWhileWriting(nil)
	h.start()
	if _, err := os.Stat(temp); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("temporary image of the cancelled build after restart: %v, want it removed", err)
	}
	// Jobs start oldest first: a resumed "doomed" would be built before.
	h.submit("next", "other-img")
	if cb := h.terminal("next"); cb.Field("status") != "BUILT" {
		t.Errorf("build after restart ended %v, want BUILT", cb.Body)
	}
	if n := h.builder.buildCount(); n != 2 {
		t.Errorf("builds = %d, want 2 (the cancelled one, never resumed, and the next)", n)
	}
	checkCancelled(t, h, "doomed", api.PhaseBuildingExt4)
	if j := h.waitJob("doomed", spool.StateFailed); j.Attempts != 1 {
		t.Errorf("cancelled job attempts = %d after restart, want 1", j.Attempts)
	}
}
