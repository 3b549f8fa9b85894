package agent

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/spool"
	"github.com/cubesandbox/cubetemplatecenter/test/cubemaster"
)

var canonicalOrder = []string{"RUNNING/PULLING/5", "RUNNING/UNPACKING/20", "fingerprint", "RUNNING/BUILDING_EXT4/40", "pull", "BUILT/READY/100"}

// isSubsequence reports whether got appears in want's order (pull reports,
// and heartbeats within a phase, may be coalesced; nothing is reordered).
func isSubsequence(got, want []string) bool {
	i := 0
	for _, g := range got {
		for i < len(want) && want[i] != g {
			i++
		}
		if i == len(want) {
			return false
		}
		i++
	}
	return true
}

func TestBuildSuccessReportsInOrder(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	h.submit("job-1", "busybox:1")
	built := h.terminal("job-1")

	got := statusPhases(h.master.Callbacks("job-1"))
	if !isSubsequence(got, canonicalOrder) || !slices.Contains(got, "fingerprint") || got[len(got)-1] != "BUILT/READY/100" {
		t.Fatalf("reports = %v, want an in-order subsequence of %v ending in BUILT", got, canonicalOrder)
	}
	if phases := withStatus(got); !slices.Equal(phases, upstreamPhases) {
		t.Errorf("status reports = %v, want upstream's %v", phases, upstreamPhases)
	}
	for _, c := range h.master.All() {
		if c.Token != testToken {
			t.Errorf("callback carried token %q, want the shared token", c.Token)
		}
	}
	img, _ := h.builder.Resolve(context.Background(), rootfs.Source{Ref: "busybox:1"})
	var req api.TemplateRequest
	json.Unmarshal(mustJSON(t, buildBody("job-1", "busybox:1")["request"]), &req)
	fp, err := api.Fingerprint(&req, img.Digest, "0123456789abcdef", "")
	if err != nil {
		t.Fatal(err)
	}
	wantPath := filepath.Join(h.cfg.Store.Dir, api.ArtifactID(fp), api.ArtifactID(fp)+".ext4")
	checks := map[string]any{
		"artifact_id": api.ArtifactID(fp), "artifact_status": "READY", "template_spec_fingerprint": fp,
		"source_image_digest": img.Digest, "ext4_path": wantPath, "master_node_ip": "http://10.0.0.1:8089",
		"cube_egress_ca_fingerprint": "0123456789abcdef", "cube_egress_ca_baked": true,
	}
	for k, want := range checks {
		if built.Body[k] != want {
			t.Errorf("BUILT %s = %v, want %v", k, built.Body[k], want)
		}
	}
	data, err := os.ReadFile(wantPath)
	if err != nil || built.Int("ext4_size_bytes") != int64(len(data)) || built.Field("ext4_sha256") == "" {
		t.Errorf("BUILT size %d sha %q for file of %d bytes (err %v)", built.Int("ext4_size_bytes"), built.Field("ext4_sha256"), len(data), err)
	}
	var cfg rootfs.ImageConfig
	if err := json.Unmarshal([]byte(built.Field("image_config_json")), &cfg); err != nil || cfg.Cmd[0] != "/bin/sh" {
		t.Errorf("image_config_json = %q (%v)", built.Field("image_config_json"), err)
	}
	j := h.waitJob("job-1", spool.StateBuilt)
	if j.Request != nil {
		t.Error("finished job still stores its request (credentials, envd)")
	}
	if depth, _ := h.sp.OutboxDepth(context.Background()); depth != 0 {
		waitOutboxEmpty(t, h)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func waitOutboxEmpty(t *testing.T, h *harness) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if n, _ := h.sp.OutboxDepth(context.Background()); n == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	reps, _ := h.sp.Reports(context.Background(), "")
	t.Fatalf("outbox never drained: %+v", reps)
}

// upstreamPhases are the status reports upstream sends for a fresh build,
// in order; CubeMaster must see each, however briefly a phase lasts.
var upstreamPhases = []string{"RUNNING/PULLING/5", "RUNNING/UNPACKING/20", "RUNNING/BUILDING_EXT4/40", "BUILT/READY/100"}

// withStatus keeps the reports that carry a status.
func withStatus(reports []string) []string {
	var out []string
	for _, r := range reports {
		if strings.Contains(r, "/") {
			out = append(out, r)
		}
	}
	return out
}

// TestEveryPhaseReachesCubeMaster: while CubeMaster answers 503, a build
// runs to its end and its reports pile up in the outbox; once CubeMaster
// answers again it gets every phase upstream sends, in upstream's order,
// not only the latest. A phase that lasted a moment (UNPACKING here) is
// reported all the same.
func TestEveryPhaseReachesCubeMaster(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		// Held reports must outlast the hold.
		c.Master.ProgressAttempts = 100
	})
	h.start()
	for _, id := range []string{"held-1", "held-2", "held-3"} {
		h.master.Hold()
		h.submit(id, "busybox:"+id)
		h.waitJob(id, spool.StateBuilt)
		h.master.Release()
		h.terminal(id)
		got := statusPhases(h.master.Callbacks(id))
		want := []string{"RUNNING/PULLING/5", "RUNNING/UNPACKING/20", "fingerprint", "RUNNING/BUILDING_EXT4/40", "pull", "BUILT/READY/100"}
		if !slices.Equal(got, want) {
			t.Errorf("%s: CubeMaster got %v\nwant %v", id, got, want)
		}
	}
}

func TestBuildStatusCodes(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Common.MaxBodyBytes = 1 << 20 })
	release := make(chan struct{})
	h.builder.beforePublish = func(ctx context.Context, spec rootfs.Spec) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	h.start()
	defer close(release)

	elf := append([]byte{0x7f, 'E', 'L', 'F'}, bytes.Repeat([]byte{1}, 100)...)
	withEnvd := func(data []byte, sha string) map[string]any {
		b := buildBody("envd-job", "img")
		b["envd_data"] = base64.StdEncoding.EncodeToString(data)
		if sha != "" {
			b["envd_sha256"] = sha
		}
		return b
	}
	without := func(field string) map[string]any {
		b := buildBody("x", "img")
		if f, ok := strings.CutPrefix(field, "request."); ok {
			delete(b["request"].(map[string]any), f)
		} else {
			delete(b, field)
		}
		return b
	}
	cases := []struct {
		name string
		body any
		code int
		msg  string
	}{
		{"MalformedJSON", []byte(`{"job_id":`), 400, "malformed JSON"},
		{"NotAnObject", []byte(`[1,2]`), 400, "malformed JSON"},
		{"MissingJobID", without("job_id"), 400, "job_id: required"},
		{"HostileJobID", map[string]any{"job_id": "../../etc", "request": map[string]any{}}, 400, "job_id"},
		{"MissingRequest", without("request"), 400, "request: required"},
		{"RequestNotObject", map[string]any{"job_id": "x", "request": "str"}, 400, "request: must be a JSON object"},
		{"MissingImageRef", without("request.source_image_ref"), 400, "request.source_image_ref: required"},
		{"MissingWritableLayer", without("request.writable_layer_size"), 400, "request.writable_layer_size: required"},
		{"InvalidImageRef", buildBody("bad-ref", "-evil;rm"), 400, "request.source_image_ref"},
		{"EnvdEmpty", map[string]any{"job_id": "e", "envd_data": "", "request": buildBody("e", "i")["request"]}, 400, "envd_data: empty"},
		{"EnvdNotELF", withEnvd([]byte("#!/bin/sh\necho hi"), ""), 400, "not an ELF binary"},
		{"EnvdTooBig", withEnvd(append(elf[:4:4], make([]byte, api.MaxEnvdBytes)...), ""), 413, "exceeds"},
		{"EnvdShaMismatch", withEnvd(elf, strings.Repeat("ab", 32)), 400, "does not match"},
		{"EnvdBadBase64", []byte(`{"job_id":"b","envd_data":"!!!","request":{"source_image_ref":"i","writable_layer_size":"1Gi"}}`), 400, "malformed JSON"},
		{"OversizedBody", []byte(`{"job_id":"big","pad":"` + strings.Repeat("x", 2<<20) + `"}`), 413, "exceeds"},
		{"Accepted", buildBody("ok-1", "img"), 200, ""},
		{"DuplicateInFlight", buildBody("ok-1", "img"), 409, "build job already in flight"},
		{"EnvdAccepted", withEnvd(elf, ""), 200, ""},
		// Upstream strips docker://, then the scheme.
		{"TransportThenScheme", buildBody("ok-2", "docker://http://harbor.internal:5000/ns/app:tag"), 200, ""},
		{"TransportTwice", buildBody("bad-2", "docker://docker://library/nginx"), 400, "request.source_image_ref"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body := h.post("/tc/api/v1/build", c.body)
			if code != c.code {
				t.Fatalf("code = %d (%v), want %d", code, body, c.code)
			}
			if c.msg != "" && !strings.Contains(body["error"].(string), c.msg) {
				t.Errorf("error = %q, want it to mention %q", body["error"], c.msg)
			}
		})
	}
	// Refused requests leave no trace in the spool.
	jobs, _ := h.sp.Jobs(context.Background(), spool.JobFilter{})
	if len(jobs) != 3 {
		t.Errorf("spool holds %d jobs, want the 3 accepted ones", len(jobs))
	}
	resp, err := http.Get(h.url + "/tc/api/v1/build")
	if err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET build = %v %v, want 405", resp.StatusCode, err)
	}
}

func TestFinishedJobResubmittedResendsResult(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	h.submit("again", "img")
	first := h.terminal("again")
	waitOutboxEmpty(t, h)
	h.submit("again", "img")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cbs, err := h.master.WaitFor(ctx, func(cbs []cubemaster.Callback) bool {
		n := 0
		for _, c := range cbs {
			if c.JobID == "again" && c.Terminal() {
				n++
			}
		}
		return n == 2
	})
	if err != nil {
		t.Fatal(err)
	}
	if h.builder.buildCount() != 1 {
		t.Errorf("builds = %d, want 1: a finished job is never rebuilt", h.builder.buildCount())
	}
	last := cbs[len(cbs)-1]
	if last.Field("artifact_id") != first.Field("artifact_id") || last.Field("status") != "BUILT" {
		t.Errorf("re-sent report %v differs from the first %v", last.Body, first.Body)
	}
}

func TestTokenRules(t *testing.T) {
	for _, c := range []struct {
		name     string
		token    string
		insecure bool
		send     string
		code     int
		msg      string
	}{
		{"Correct", "tok", false, "tok", 200, ""},
		{"CorrectWithWhitespace", "tok", false, "  tok ", 200, ""},
		{"Wrong", "tok", false, "nope", 401, "invalid or missing shared token"},
		{"Missing", "tok", false, "", 401, "invalid or missing shared token"},
		{"UnsetFailsClosed", "", false, "", 503, "CUBE_TEMPLATE_CALLBACK_TOKEN is not configured on template center"},
		{"UnsetInsecureOptIn", "", true, "", 200, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, func(cfg *config.Config) {
				cfg.Master.Token, cfg.Master.InsecureNoToken = c.token, c.insecure
			})
			h.start()
			code, body := h.postWithToken("/tc/api/v1/build", buildBody("tok-job", "img"), c.send)
			if code != c.code || (c.msg != "" && body["error"] != c.msg) {
				t.Errorf("build = %d %v, want %d %q", code, body, c.code, c.msg)
			}
			code, _ = h.postWithToken("/tc/api/v1/artifact/delete", map[string]any{"artifact_id": "rfs-x"}, c.send)
			if code != c.code {
				t.Errorf("artifact/delete = %d, want %d", code, c.code)
			}
			for _, open := range []string{"/health", "/metrics"} {
				resp, err := http.Get(h.url + open)
				if err != nil || resp.StatusCode != 200 {
					t.Errorf("GET %s = %v %v, want 200 without a token", open, resp.StatusCode, err)
				}
			}
		})
	}
}

func TestQueueFullAndFIFO(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Build.MaxConcurrentBuilds = 1
		c.Build.QueueSize = 2
	})
	release := make(chan struct{})
	var order []string
	h.builder.beforePublish = func(ctx context.Context, spec rootfs.Spec) error {
		order = append(order, spec.ArtifactID)
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	}
	h.start()
	h.submit("q1", "img-1")
	h.waitJob("q1", spool.StateRunning)
	h.submit("q2", "img-2")
	h.submit("q3", "img-3")
	code, body := h.post("/tc/api/v1/build", buildBody("q4", "img-4"))
	if code != http.StatusTooManyRequests || body["error"] != "build queue is full" {
		t.Fatalf("4th job = %d %v, want 429", code, body)
	}
	if _, err := h.sp.Job(context.Background(), "q4"); !errors.Is(err, spool.ErrNotFound) {
		t.Errorf("refused job is in the spool: %v", err)
	}
	// The refusal is logged once, by the request log, naming the job.
	if n := strings.Count(h.logs.String(), "q4"); n != 1 {
		t.Errorf("the refused job appears in %d log lines, want 1 (the rejected request):\n%s", n, h.logs.String())
	} else if !strings.Contains(h.logs.String(), "job_id=q4 queue_size=2") {
		t.Errorf("the rejection line lacks the job and the queue size:\n%s", h.logs.String())
	}
	close(release)
	for _, id := range []string{"q1", "q2", "q3"} {
		if cb := h.terminal(id); cb.Field("status") != "BUILT" {
			t.Errorf("%s ended %v", id, cb.Body)
		}
	}
	var want []string
	for _, id := range []string{"q1", "q2", "q3"} {
		j, _ := h.sp.Job(context.Background(), id)
		want = append(want, j.ArtifactID)
	}
	if !slices.Equal(order, want) {
		t.Errorf("build order = %v, want FIFO %v", order, want)
	}
}

func TestSameFingerprintBuildsOnceAndReuses(t *testing.T) {
	h := newHarness(t, nil)
	release := make(chan struct{})
	var started atomic.Int32
	h.builder.beforePublish = func(ctx context.Context, spec rootfs.Spec) error {
		started.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	}
	h.start()
	h.submit("twin-a", "same-image")
	h.submit("twin-b", "same-image")
	h.waitJob("twin-a", spool.StateRunning)
	h.waitJob("twin-b", spool.StateRunning)
	// One twin leads the flight and is held before publishing; the other
	// logs once it has joined it.
	waitLogged(t, h, "identical build in flight, waiting for it", 1)
	close(release)
	a, b := h.terminal("twin-a"), h.terminal("twin-b")
	if a.Field("status") != "BUILT" || b.Field("status") != "BUILT" || a.Field("artifact_id") != b.Field("artifact_id") {
		t.Fatalf("twins ended %v and %v, want the same BUILT artifact", a.Body, b.Body)
	}
	if n := h.builder.buildCount(); n != 1 {
		t.Errorf("builds = %d, want 1 for two jobs with one fingerprint", n)
	}

	// A later job with the same spec reuses the published artifact.
	h.submit("twin-c", "same-image")
	c := h.terminal("twin-c")
	if c.Field("artifact_id") != a.Field("artifact_id") || h.builder.buildCount() != 1 {
		t.Errorf("reuse: artifact %s, builds %d", c.Field("artifact_id"), h.builder.buildCount())
	}
	// A changed artifact file is not reused blindly.
	if err := os.WriteFile(a.Field("ext4_path"), []byte("tampered"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.submit("twin-d", "same-image")
	d := h.terminal("twin-d")
	if h.builder.buildCount() != 2 || d.Field("ext4_sha256") != a.Field("ext4_sha256") {
		t.Errorf("after tampering: builds %d, sha %s (want a rebuild with the original sha %s)",
			h.builder.buildCount(), d.Field("ext4_sha256"), a.Field("ext4_sha256"))
	}
	metrics := scrape(t, h)
	for _, want := range []string{`cube_templatecenter_build_dedup_hits_total{kind="inflight"} 1`,
		`cube_templatecenter_build_dedup_hits_total{kind="reuse"} 1`, `cube_templatecenter_jobs_finished_total{result="built"} 4`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func scrape(t *testing.T, h *harness) string {
	t.Helper()
	resp, err := http.Get(h.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestFailuresReportPhase(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	h.builder.mu.Lock()
	h.builder.resolveErr = errors.New("registry.test: unexpected status 404")
	h.builder.mu.Unlock()
	h.submit("f-pull", "missing")
	if cb := h.terminal("f-pull"); cb.Field("status") != "FAILED" || cb.Field("phase") != "PULLING" ||
		!strings.Contains(cb.Field("error_message"), "404") {
		t.Errorf("pull failure = %v", cb.Body)
	}
	h.builder.mu.Lock()
	h.builder.resolveErr, h.builder.caErr = nil, errors.New("no CA at /etc/cube/ca/cube-root-ca.crt")
	h.builder.mu.Unlock()
	h.submit("f-ca", "img")
	if cb := h.terminal("f-ca"); cb.Field("phase") != "UNPACKING" || !strings.Contains(cb.Field("error_message"), "cube egress CA") {
		t.Errorf("CA failure = %v", cb.Body)
	}
	h.builder.mu.Lock()
	h.builder.caErr = nil
	h.builder.beforePublish = func(context.Context, rootfs.Spec) error { return errors.New("no space left on device") }
	h.builder.mu.Unlock()
	h.submit("f-build", "img")
	if cb := h.terminal("f-build"); cb.Field("phase") != "BUILDING_EXT4" || !strings.Contains(cb.Field("error_message"), "no space") {
		t.Errorf("build failure = %v", cb.Body)
	}
	// with_cube_ca=false never loads the CA.
	h.builder.mu.Lock()
	h.builder.caErr, h.builder.beforePublish = errors.New("must not be called"), nil
	h.builder.mu.Unlock()
	b := buildBody("no-ca", "img")
	b["request"].(map[string]any)["with_cube_ca"] = false
	if code, _ := h.post("/tc/api/v1/build", b); code != 200 {
		t.Fatal(code)
	}
	if cb := h.terminal("no-ca"); cb.Field("status") != "BUILT" || cb.Body["cube_egress_ca_baked"] != false {
		t.Errorf("with_cube_ca=false = %v", cb.Body)
	}
}

func TestHeartbeatsDuringSlowBuild(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Build.HeartbeatInterval = 30 * time.Millisecond })
	isBeat := func(c cubemaster.Callback) bool {
		return c.JobID == "slow" && c.Field("status") == "RUNNING" && c.Field("phase") == "BUILDING_EXT4"
	}
	// The build lasts until CubeMaster has seen three reports of it, or 10 s.
	h.builder.beforePublish = func(ctx context.Context, spec rootfs.Spec) error {
		h.waitCallbacks(ctx, isBeat, 3)
		return nil
	}
	h.start()
	h.submit("slow", "img")
	h.terminal("slow")
	if beats := countCallbacks(h.master.Callbacks("slow"), isBeat); beats < 3 {
		t.Errorf("got %d RUNNING/BUILDING_EXT4 reports during a 10s build with a 30ms heartbeat, want several", beats)
	}
}

func TestTerminalReportSurvivesMasterOutageAndRestart(t *testing.T) {
	h := newHarness(t, func(c *config.Config) {
		c.Master.RetryInitial, c.Master.RetryMax = 50*time.Millisecond, 100*time.Millisecond
	})
	h.start()
	h.master.Stop()
	h.submit("outage", "img")
	h.waitJob("outage", spool.StateBuilt)
	// Several deliveries of the terminal report fail; it stays in the outbox.
	var reps []spool.Report
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		reps, _ = h.sp.Reports(context.Background(), "outage")
		i := slices.IndexFunc(reps, func(r spool.Report) bool { return r.Terminal })
		if i >= 0 && reps[i].Attempts >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("terminal report not in the outbox after 3 failed deliveries: %+v", reps)
		}
	}
	h.stop()
	if err := h.master.Restart(); err != nil {
		t.Fatal(err)
	}
	h.start()
	if cb := h.terminal("outage"); cb.Field("status") != "BUILT" {
		t.Errorf("after restart: %v", cb.Body)
	}
	waitOutboxEmpty(t, h)
}

func TestPermanentRefusalDropsReport(t *testing.T) {
	h := newHarness(t, nil)
	h.master.Respond(func(jobID string, body map[string]any) int {
		if body["status"] == "BUILT" {
			return http.StatusNotFound
		}
		return 0
	})
	h.start()
	h.submit("refused", "img")
	h.waitJob("refused", spool.StateBuilt)
	waitOutboxEmpty(t, h)
	if m := scrape(t, h); !strings.Contains(m, `cube_templatecenter_callback_attempts_total{kind="terminal",outcome="dropped"} 1`) {
		t.Errorf("drop not counted:\n%s", grep(m, "callback"))
	}
	if !strings.Contains(h.logs.String(), "report refused by CubeMaster") {
		t.Error("drop not logged")
	}
}

func TestRetryableAnswersAreRetried(t *testing.T) {
	h := newHarness(t, nil)
	var fails atomic.Int32
	h.master.Respond(func(jobID string, body map[string]any) int {
		if body["status"] == "BUILT" && fails.Add(1) <= 3 {
			return []int{500, 429, 503}[fails.Load()-1]
		}
		return 0
	})
	h.start()
	h.submit("flaky", "img")
	if cb := h.terminal("flaky"); cb.Field("status") != "BUILT" {
		t.Fatal(cb.Body)
	}
	if fails.Load() != 4 {
		t.Errorf("BUILT attempts = %d, want 3 refusals then success", fails.Load())
	}
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestShutdownRequeuesAndResumes(t *testing.T) {
	h := newHarness(t, nil)
	entered := make(chan struct{}, 1)
	h.builder.beforePublish = func(ctx context.Context, spec rootfs.Spec) error {
		entered <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}
	h.start()
	h.submit("interrupted", "img")
	<-entered
	h.stop()
	j, err := func() (spool.Job, error) {
		sp, err := spool.Open(context.Background(), h.cfg.Spool.Path)
		if err != nil {
			return spool.Job{}, err
		}
		defer sp.Close()
		return sp.Job(context.Background(), "interrupted")
	}()
	if err != nil || j.State != spool.StateQueued {
		t.Fatalf("after stop job = %+v (%v), want queued", j, err)
	}
	for _, c := range h.master.Callbacks("interrupted") {
		if c.Terminal() {
			t.Fatalf("stopping the agent sent a terminal report: %v", c.Body)
		}
	}
	h.builder.beforePublish = nil
	h.start()
	if cb := h.terminal("interrupted"); cb.Field("status") != "BUILT" {
		t.Errorf("resumed job ended %v", cb.Body)
	}
	j = h.waitJob("interrupted", spool.StateBuilt)
	if j.Attempts != 2 {
		t.Errorf("attempts = %d, want 2", j.Attempts)
	}
}

func TestStoppingRefusesBuilds(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	h.agent.stopping.Store(true)
	code, body := h.post("/tc/api/v1/build", buildBody("late", "img"))
	if code != http.StatusServiceUnavailable || !strings.Contains(body["error"].(string), "shutting down") {
		t.Errorf("build while stopping = %d %v, want 503", code, body)
	}
	resp, err := http.Get(h.url + "/health")
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("health while stopping = %v %v, want 503", resp.StatusCode, err)
	}
	h.agent.stopping.Store(false)
}

func TestPoisonJobGivesUp(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Build.MaxAttempts = 2 })
	sp, err := spool.Open(context.Background(), h.cfg.Spool.Path)
	if err != nil {
		t.Fatal(err)
	}
	body := mustJSON(t, buildBody("poison", "img"))
	sp.Enqueue(context.Background(), spool.NewJob{ID: "poison", Request: body}, 10)
	for i := 0; i < 2; i++ { // two crashes mid-build
		sp.ClaimNext(context.Background())
		sp.RequeueRunning(context.Background())
	}
	sp.Close()
	h.start()
	cb := h.terminal("poison")
	if cb.Field("status") != "FAILED" || !strings.Contains(cb.Field("error_message"), "interrupted 2 times") {
		t.Errorf("poison job = %v", cb.Body)
	}
	if h.builder.buildCount() != 0 {
		t.Error("poison job was built again")
	}
}

func TestArtifactDelete(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	h.submit("del", "img")
	cb := h.terminal("del")
	id := cb.Field("artifact_id")
	outside := filepath.Join(h.dir, "outside")
	os.WriteFile(outside, []byte("keep"), 0o644)
	for _, bad := range []string{"../outside", "/etc", "..", ".", "a/b", "", "   ", "rfs-x\x00y"} {
		code, body := h.post("/tc/api/v1/artifact/delete", map[string]any{"artifact_id": bad})
		if code != http.StatusBadRequest {
			t.Errorf("delete %q = %d %v, want 400", bad, code, body)
		}
	}
	if code, _ := h.post("/tc/api/v1/artifact/delete", []byte("{")); code != 400 {
		t.Errorf("malformed delete = %d, want 400", code)
	}
	if _, err := os.Stat(outside); err != nil {
		t.Fatal("a refused delete removed a file outside the store")
	}
	// What is not an artifact directory is refused and left in place: a
	// symlink (never followed), or a directory of the shared store holding
	// anything but the artifact's image.
	os.Symlink(h.dir, filepath.Join(h.cfg.Store.Dir, "rfs-link"))
	foreign := filepath.Join(h.cfg.Store.Dir, "cubemaster-templates", "index.json")
	os.MkdirAll(filepath.Dir(foreign), 0o755)
	os.WriteFile(foreign, []byte("{}"), 0o644)
	for _, notArtifact := range []string{"rfs-link", "cubemaster-templates"} {
		code, body := h.post("/tc/api/v1/artifact/delete", map[string]any{"artifact_id": notArtifact})
		if msg, _ := body["error"].(string); code != http.StatusConflict || !strings.Contains(msg, "left in place") {
			t.Errorf("delete %s = %d %v, want 409 saying it was left in place", notArtifact, code, body)
		}
	}
	if _, err := os.Stat(outside); err != nil {
		t.Fatal("deleting a symlinked artifact followed the link")
	}
	if _, err := os.Lstat(filepath.Join(h.cfg.Store.Dir, "rfs-link")); err != nil {
		t.Errorf("refused delete removed the symlink: %v", err)
	}
	if _, err := os.Stat(foreign); err != nil {
		t.Errorf("refused delete removed a foreign directory's file: %v", err)
	}
	for i := 0; i < 2; i++ { // idempotent
		code, body := h.post("/tc/api/v1/artifact/delete", map[string]any{"artifact_id": id})
		if code != 200 || body["status"] != "deleted" || body["artifact_id"] != id {
			t.Errorf("delete #%d = %d %v", i+1, code, body)
		}
	}
	if _, err := os.Stat(filepath.Join(h.cfg.Store.Dir, id)); !os.IsNotExist(err) {
		t.Errorf("artifact dir still there: %v", err)
	}
	// The spool forgot it: the same spec builds again.
	h.submit("del-2", "img")
	h.terminal("del-2")
	if h.builder.buildCount() != 2 {
		t.Errorf("builds = %d, want a rebuild after delete", h.builder.buildCount())
	}
}

func TestArtifactDeleteWhileBuilding(t *testing.T) {
	h := newHarness(t, nil)
	entered, release := h.pauseAtPublish()
	h.start()
	h.submit("busy", "img")
	id := <-entered
	code, body := h.post("/tc/api/v1/artifact/delete", map[string]any{"artifact_id": id})
	close(release)
	if code != http.StatusConflict {
		t.Errorf("delete during build = %d %v, want 409", code, body)
	}
	h.terminal("busy")
}

func TestHealthReportsFailingCheck(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	if err := os.RemoveAll(h.cfg.Store.Dir); err != nil {
		t.Fatal(err)
	}
	code, body := h.waitHealth("the store missing", func(code int, _ healthBody) bool { return code != http.StatusOK })
	if code != 503 || body.Status != "not_ready" || body.Checks["store"] || !body.Checks["spool"] || body.Errors["store"] == "" {
		t.Errorf("health with missing store = %d %+v", code, body)
	}
	os.MkdirAll(h.cfg.Store.Dir, 0o755)
}

func TestMetricsExposeBuildSeries(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	h.submit("m1", "img")
	h.terminal("m1")
	waitOutboxEmpty(t, h)
	m := scrape(t, h)
	for _, want := range []string{
		"cube_templatecenter_jobs_accepted_total 1",
		`cube_templatecenter_jobs_finished_total{result="built"} 1`,
		`cube_templatecenter_build_phase_duration_seconds_count{phase="PULLING"} 1`,
		`cube_templatecenter_build_phase_duration_seconds_count{phase="UNPACKING"} 1`,
		`cube_templatecenter_build_phase_duration_seconds_count{phase="BUILDING_EXT4"} 1`,
		"cube_templatecenter_jobs_queue_wait_seconds_count 1",
		`cube_templatecenter_jobs_turnaround_seconds_count{result="built"} 1`,
		"cube_templatecenter_queue_depth 0",
		"cube_templatecenter_jobs_running 0",
		"cube_templatecenter_spool_scrape_success 1",
		"cube_templatecenter_outbox_depth 0",
		"cube_templatecenter_layer_cache_bytes 4096",
		"cube_templatecenter_layer_cache_blobs 2",
		"cube_templatecenter_layer_cache_zstd_blobs 1",
		"cube_templatecenter_layer_cache_transcode_pending 1",
		"cube_templatecenter_layer_cache_transcoded_total 3",
		"cube_templatecenter_layer_cache_transcode_failures_total 1",
		`cube_templatecenter_layer_cache_requests_total{result="hit"} 5`,
		`cube_templatecenter_layer_cache_requests_total{result="miss"} 2`,
		`cube_templatecenter_callback_attempts_total{kind="terminal",outcome="delivered"} 1`,
		"go_goroutines", "process_resident_memory_bytes",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestReloadAppliesValidAndRefusesInvalid(t *testing.T) {
	h := newHarness(t, nil)
	path := filepath.Join(h.dir, "conf.yaml")
	h.env[config.PathEnv] = path
	base := "common:\n  http_port: 8090\nstore:\n  dir: " + h.cfg.Store.Dir + "\n  work_dir: " + h.cfg.Store.WorkDir +
		"\nspool:\n  path: " + h.cfg.Spool.Path + "\nmaster:\n  addr: " + h.master.URL() + "\n"
	h.env["CUBE_TEMPLATE_CALLBACK_TOKEN"] = testToken
	h.start()
	os.WriteFile(path, []byte(base+"log:\n  level: debug\nbuild:\n  max_concurrent_builds: 5\n  queue_size: 7\n  heartbeat_interval: 3s\n  timeout: 90m\n"), 0o644)
	if got := testutil.ToFloat64(h.agent.metrics.reloadOK); got != 1 {
		t.Errorf("config_last_reload_successful = %v at start, want 1", got)
	}
	started := testutil.ToFloat64(h.agent.metrics.reloadTime)
	if started < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Errorf("config_last_reload_success_timestamp_seconds = %v at start, want about now", started)
	}
	if err := h.agent.Reload(); err != nil {
		t.Fatalf("valid reload: %v", err)
	}
	c := h.agent.config()
	if c.Build.MaxConcurrentBuilds != 5 || c.Build.QueueSize != 7 || c.Build.HeartbeatInterval != 3*time.Second || c.Build.Timeout != 90*time.Minute || h.agent.level.Level().String() != "DEBUG" {
		t.Errorf("after reload: %+v level %v", c.Build, h.agent.level.Level())
	}
	if c.Common.HTTPPort != h.cfg.Common.HTTPPort {
		t.Error("reload changed the listener settings, which need a restart")
	}
	os.WriteFile(path, []byte(base+"build:\n  max_concurrent_builds: 0\n"), 0o644)
	err := h.agent.Reload()
	if err == nil || !strings.Contains(err.Error(), "build.max_concurrent_builds") {
		t.Errorf("invalid reload = %v, want an error naming the key", err)
	}
	if h.agent.config().Build.MaxConcurrentBuilds != 5 {
		t.Error("an invalid reload changed the running configuration")
	}
	if got := testutil.ToFloat64(h.agent.metrics.reloadOK); got != 0 {
		t.Errorf("config_last_reload_successful = %v after a refused reload, want 0", got)
	}
	if !strings.Contains(h.logs.String(), "outcome=refused") {
		t.Errorf("the log does not say the reload was refused:\n%s", h.logs.String())
	}
	reloading := regexp.MustCompile(`^RELOADING=1\nMONOTONIC_USEC=[0-9]+\n?$`)
	n := 0
	for _, note := range h.notifications() {
		if strings.HasPrefix(note, "RELOADING") {
			n++
			if !reloading.MatchString(note) {
				t.Errorf("reload notification %q is malformed", note)
			}
		}
	}
	if n != 2 {
		t.Errorf("%d RELOADING notifications, want 2: %q", n, h.notifications())
	}
	// The reloaded CubeMaster address is used for the next report.
	other, err := cubemaster.Start(testToken)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Stop()
	os.WriteFile(path, []byte(strings.Replace(base, h.master.URL(), other.URL(), 1)), 0o644)
	if err := h.agent.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(h.agent.metrics.reloadOK); got != 1 {
		t.Errorf("config_last_reload_successful = %v after a valid reload, want 1", got)
	}
	h.submit("moved", "img")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := other.WaitTerminal(ctx, "moved"); err != nil {
		t.Errorf("report did not follow the reloaded master address: %v", err)
	}
}

func TestNotifyAndWatchdog(t *testing.T) {
	interval := 200 * time.Millisecond
	h2 := newHarness(t, nil)
	h2.watchdog = interval
	h2.start()
	notes := waitNotes(t, h2, "READY, several WATCHDOG and a STATUS", func(notes []string) bool {
		return slices.Contains(notes, "READY=1") && countPrefix(notes, "WATCHDOG=1") >= 3 && countPrefix(notes, "STATUS=") >= 1
	})
	if s := notes[slices.IndexFunc(notes, func(s string) bool { return strings.HasPrefix(s, "STATUS=") })]; !strings.Contains(s, "queued") || !strings.Contains(s, "running") || !strings.Contains(s, "builds") {
		t.Errorf("status line %q lacks counts", s)
	}

	// Wedge the spool: another connection holds the write lock.
	db, err := sql.Open("sqlite3", "file:"+h2.cfg.Spool.Path+"?_busy_timeout=100")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(context.Background(), "BEGIN EXCLUSIVE"); err != nil {
		t.Fatal(err)
	}
	// The watchdog probes, then pings or logs, in one goroutine: once a
	// failure is logged, a ping of a probe under way before the lock was
	// taken has been sent, and every ping after it is one too many.
	const failed = "health probe failed, withholding watchdog ping"
	first := waitLogged(t, h2, failed, 1)
	before := countPrefix(h2.notifications(), "WATCHDOG=1")
	waitLogged(t, h2, failed, first+3)
	during := countPrefix(h2.notifications(), "WATCHDOG=1") - before
	conn.ExecContext(context.Background(), "ROLLBACK")
	conn.Close()
	if during != 0 {
		t.Errorf("%d watchdog pings while the spool was wedged, want none", during)
	}
	waitNotes(t, h2, "watchdog pings resuming after the spool recovered", func(notes []string) bool {
		return countPrefix(notes, "WATCHDOG=1")-before-during >= 1
	})
	h2.stop()
	if notes := h2.notifications(); notes[len(notes)-1] != "STOPPING=1" {
		t.Errorf("last notification = %q, want STOPPING=1", notes[len(notes)-1])
	}
}

// waitNotes waits until the agent's notifications satisfy cond and returns
// them.
func waitNotes(t *testing.T, h *harness, what string, cond func([]string) bool) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		notes := h.notifications()
		if cond(notes) {
			return notes
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 10s: notifications = %q", what, notes)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitLogged waits until the agent's log holds msg at least n times and
// returns how many times it does.
func waitLogged(t *testing.T, h *harness, msg string, n int) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got := strings.Count(h.logs.String(), msg); got >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent did not log %q %d times within 10s", msg, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func countPrefix(ss []string, prefix string) int {
	n := 0
	for _, s := range ss {
		if strings.HasPrefix(s, prefix) {
			n++
		}
	}
	return n
}

func TestFinishedJobsArePurgedWhileRunning(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Spool.Retention = 100 * time.Millisecond })
	h.purgeEvery = 50 * time.Millisecond
	h.start()
	h.submit("old", "img")
	h.terminal("old")
	waitOutboxEmpty(t, h)
	h.waitJobGone("old")
}

// waitJobGone waits until the spool no longer holds the job.
func (h *harness) waitJobGone(id string) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := h.sp.Job(context.Background(), id); errors.Is(err, spool.ErrNotFound) {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("job %s was not purged", id)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStopLoopsWaitsForThem holds the watchdog and status loops inside a
// notification and checks that stopping them returns only once each has
// been let go and returned.
func TestStopLoopsWaitsForThem(t *testing.T) {
	cfg := config.Default()
	cfg.Store.Dir = t.TempDir()
	sp := tempSpool(t)
	synctest.Test(t, func(t *testing.T) {
		held := map[string]chan struct{}{"WATCHDOG=1": make(chan struct{}), "STATUS=": make(chan struct{})}
		release := map[string]chan struct{}{"WATCHDOG=1": make(chan struct{}), "STATUS=": make(chan struct{})}
		var mu sync.Mutex
		seen := map[string]bool{}
		notify := func(s string) {
			for prefix := range held {
				if !strings.HasPrefix(s, prefix) {
					continue
				}
				mu.Lock()
				first := !seen[prefix]
				seen[prefix] = true
				mu.Unlock()
				if first { // hold only the first one
					close(held[prefix])
					<-release[prefix]
				}
			}
		}
		a := New(Options{Config: cfg, Spool: sp, Builder: &testBuilder{}, Logger: slog.New(slog.DiscardHandler),
			Notify: notify, Watchdog: time.Minute})
		stop := a.startLoops(context.Background())
		<-held["WATCHDOG=1"]
		<-held["STATUS="]
		stopped := make(chan struct{})
		go func() { stop(); close(stopped) }()
		isStopped := func() bool {
			synctest.Wait()
			select {
			case <-stopped:
				return true
			default:
				return false
			}
		}
		if isStopped() {
			t.Fatal("stop returned while the watchdog and status loops were still running")
		}
		close(release["WATCHDOG=1"])
		if isStopped() {
			t.Fatal("stop returned while the status loop was still running")
		}
		close(release["STATUS="])
		if !isStopped() {
			t.Fatal("stop did not return after every loop returned")
		}
	})
}

// countCallbacks counts the callbacks for which match holds.
func countCallbacks(cbs []cubemaster.Callback, match func(cubemaster.Callback) bool) int {
	n := 0
	for _, c := range cbs {
		if match(c) {
			n++
		}
	}
	return n
}

// waitCallbacks waits, for up to 10 s or until ctx ends, until CubeMaster
// has seen n callbacks for which match holds.
func (h *harness) waitCallbacks(ctx context.Context, match func(cubemaster.Callback) bool, n int) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	h.master.WaitFor(ctx, func(cbs []cubemaster.Callback) bool { return countCallbacks(cbs, match) >= n })
}
