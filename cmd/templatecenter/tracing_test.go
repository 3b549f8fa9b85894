package main

// Black-box test of tracing: the agent exports OTLP/HTTP to a receiver the
// test runs, continues the trace CubeMaster's build request carries, puts
// it on every callback, and resumes it after a kill -9 mid-build.

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/test/wait"

	"github.com/cubesandbox/cubetemplatecenter/test/images"
	"github.com/cubesandbox/cubetemplatecenter/test/otlpreceiver"
)

const (
	tracedTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	tracedSpanID  = "00f067aa0ba902b7"
)

// submitTraced posts a build of image with CubeMaster's traceparent.
func submitTraced(t testing.TB, base, jobID, image, traceparent string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/tc/api/v1/build", bytes.NewReader(buildBody(t, jobID, image)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(tokenHeader, testToken)
	req.Header.Set("traceparent", traceparent)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /tc/api/v1/build %s: HTTP %d, want 200", jobID, resp.StatusCode)
	}
}

// TestTraceSurvivesRestart: a build submitted with a traceparent is killed
// (SIGKILL) while its layers download; the restarted agent builds it. The
// spans both processes export belong to the submitted trace: the first
// process's submit span is the child of CubeMaster's span, the second
// process's build span the child of that submit span (the context stored
// with the job), and every callback CubeMaster gets carries the trace.
func TestTraceSurvivesRestart(t *testing.T) {
	t.Parallel()
	recv := otlpreceiver.Start()
	t.Cleanup(recv.Close)
	cm := startCubeMaster(t, testToken)
	img := cliImage(t)
	config, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	// While held, the image's layers never come: the first agent is
	// killed in the middle of the download.
	var held atomic.Bool
	held.Store(true)
	reg := images.StartRegistry(t, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if d, ok := images.BlobDigest(r); ok && r.Method == http.MethodGet && d != config.String() && held.Load() {
				<-r.Context().Done()
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	image := reg.Push(t, "blackbox/traced:v1", img)

	h := newHarness(t, cm.URL(), testToken)
	h.set("registry.insecure", []string{reg.Host})
	store := h.cfg["store"]["dir"].(string)
	env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + recv.URL(), "OTEL_BSP_SCHEDULE_DELAY=50"}
	first := h.startAgent("agent (killed mid-build)", env...)
	const id = "traced-1"
	submitTraced(t, h.baseURL(), id, image, "00-"+tracedTraceID+"-"+tracedSpanID+"-01")
	wait.For(t, "a temporary image in the store", func() bool { return len(images.StoreTemps(t, store)) > 0 })
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if _, err := recv.WaitFor(ctx, func(s []otlpreceiver.Span) bool {
		return hasSpan(s, "cubetemplatecenter.template.image.submit") && hasSpan(s, "cubetemplatecenter.template.image.prepare_source")
	}); err != nil {
		t.Fatalf("the first agent's submit and prepare_source spans: %v", err)
	}
	firstPID := strconv.Itoa(first.cmd.Process.Pid)
	first.kill(t)

	held.Store(false)
	second := h.startAgent("agent (restarted)", env...)
	if cb := waitTerminal(t, cm, id); cb.Field("status") != "BUILT" {
		t.Fatalf("resumed job ended %v, want BUILT", cb.Body)
	}
	waitOutboxEmpty(t, h.baseURL())
	secondPID := strconv.Itoa(second.cmd.Process.Pid)
	second.stop(t) // flushes the spans still queued
	if s := h.showJob(id); !strings.Contains(s.raw, `"traceparent": "00-`+tracedTraceID) {
		t.Errorf("jobs show %s does not give the job's traceparent:\n%s", id, s.raw)
	}

	spans := recv.Spans()
	byPID := map[string][]otlpreceiver.Span{}
	for _, s := range spans {
		if s.TraceID != tracedTraceID {
			t.Errorf("span %s of trace %s, want every span of the job in %s", s.Name, s.TraceID, tracedTraceID)
		}
		if s.Resource["service.name"] != "cube-templatecenter" || s.Resource["service.version"] != testVersion {
			t.Errorf("span %s resource %v, want service.name cube-templatecenter, version %s", s.Name, s.Resource, testVersion)
		}
		byPID[s.Resource["process.pid"]] = append(byPID[s.Resource["process.pid"]], s)
	}
	submitSpan, ok := named(byPID[firstPID], "cubetemplatecenter.template.image.submit")
	if !ok {
		t.Fatalf("no submit span from the first agent (pid %s); spans: %v", firstPID, spanNames(spans))
	}
	if submitSpan.ParentSpanID != tracedSpanID || submitSpan.Attrs["cube.job_id"] != id {
		t.Errorf("submit span parent %s, job %q; want CubeMaster's span %s and job %s", submitSpan.ParentSpanID,
			submitSpan.Attrs["cube.job_id"], tracedSpanID, id)
	}
	later := byPID[secondPID]
	build, ok := named(later, "cubetemplatecenter.template.image.build")
	if !ok {
		t.Fatalf("no build span from the restarted agent (pid %s); spans: %v", secondPID, spanNames(spans))
	}
	if build.ParentSpanID != submitSpan.SpanID {
		t.Errorf("resumed build span parent = %s, want the stored submit span %s", build.ParentSpanID, submitSpan.SpanID)
	}
	if build.Attrs["attempt"] != "2" || build.Attrs["cube.job_id"] != id || build.Attrs["cube.request_id"] == "" || build.Error {
		t.Errorf("resumed build span attributes %v, error %v; want attempt 2, job %s, a request id, no error", build.Attrs, build.Error, id)
	}
	for _, name := range []string{"prepare_source", "reuse", "rootfs", "artifact.callback"} {
		s, ok := named(later, "cubetemplatecenter.template.image."+name)
		if !ok {
			t.Errorf("no %s span from the restarted agent; spans: %v", name, spanNames(later))
			continue
		}
		if s.ParentSpanID != build.SpanID {
			t.Errorf("%s span parent = %s, want the build span %s", name, s.ParentSpanID, build.SpanID)
		}
	}
	rootfsSpan, _ := named(later, "cubetemplatecenter.template.image.rootfs")
	for _, name := range []string{"layer.fetch", "layer.apply", "ext4"} {
		s, ok := named(later, "cubetemplatecenter.template.image."+name)
		if !ok {
			t.Errorf("no %s span from the restarted agent's builder; spans: %v", name, spanNames(later))
			continue
		}
		if s.ParentSpanID != rootfsSpan.SpanID || s.Error {
			t.Errorf("%s span parent %s, error %v; want the rootfs span %s, no error", name, s.ParentSpanID, s.Error, rootfsSpan.SpanID)
		}
	}
	if f, _ := named(later, "cubetemplatecenter.template.image.layer.fetch"); f.Attrs["cache_hit"] != "false" || f.Attrs["oci.layer.digest"] == "" {
		t.Errorf("layer fetch span attributes %v, want the digest and cache_hit=false (the killed agent never got the layer)", f.Attrs)
	}
	callback, _ := named(later, "cubetemplatecenter.template.image.artifact.callback")
	attempt, ok := named(later, "cubetemplatecenter.template.image.artifact.report.attempt")
	if !ok || attempt.ParentSpanID != callback.SpanID || attempt.Attrs["http.response.status_code"] != "200" {
		t.Errorf("report attempt span %+v (found %v), want a 200 under the callback span %s", attempt, ok, callback.SpanID)
	}
	cbs := 0
	for _, cb := range cm.All() {
		if cb.JobID != id {
			continue
		}
		cbs++
		if !strings.HasPrefix(cb.Traceparent, "00-"+tracedTraceID+"-") {
			t.Errorf("callback %v carries traceparent %q, not of trace %s", cb.Body["status"], cb.Traceparent, tracedTraceID)
		}
		if cb.Terminal() && cb.Traceparent != "00-"+tracedTraceID+"-"+attempt.SpanID+"-01" {
			t.Errorf("terminal callback traceparent %q, want its attempt span %s", cb.Traceparent, attempt.SpanID)
		}
	}
	if cbs < 2 {
		t.Errorf("CubeMaster got %d callbacks of %s, want progress and the terminal report", cbs, id)
	}
}

func hasSpan(spans []otlpreceiver.Span, name string) bool {
	_, ok := named(spans, name)
	return ok
}

// named returns the last span called name.
func named(spans []otlpreceiver.Span, name string) (otlpreceiver.Span, bool) {
	var out otlpreceiver.Span
	found := false
	for _, s := range spans {
		if s.Name == name {
			out, found = s, true
		}
	}
	return out, found
}

func spanNames(spans []otlpreceiver.Span) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name+"@"+s.Resource["process.pid"])
	}
	return out
}

// TestCollectorThatHangsCostsNothing: with a collector that accepts
// connections and never answers, and an export queue of one span, builds
// go on as without tracing: the job is BUILT, the spans that find the
// queue full are dropped and counted, and the agent still stops in time.
func TestCollectorThatHangsCostsNothing(t *testing.T) {
	t.Parallel()
	gone := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-gone:
		}
	}))
	t.Cleanup(func() { close(gone); hang.Close() })
	cm := startCubeMaster(t, testToken)
	reg := images.StartRegistry(t, nil)
	image := reg.Push(t, "blackbox/untraced:v1", cliImage(t))
	h := newHarness(t, cm.URL(), testToken)
	h.set("registry.insecure", []string{reg.Host})
	p := h.startAgent("agent", "OTEL_EXPORTER_OTLP_ENDPOINT="+hang.URL, "OTEL_BSP_SCHEDULE_DELAY=10",
		"OTEL_BSP_MAX_QUEUE_SIZE=1", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE=1")
	const id = "hung-collector"
	submit(t, h.baseURL(), testToken, id, image)
	if cb := waitTerminal(t, cm, id); cb.Field("status") != "BUILT" {
		t.Fatalf("build with a hung collector ended %v, want BUILT", cb.Body)
	}
	wait.For(t, "spans dropped as queue_full", func() bool {
		v, err := scrapeMetric(h.baseURL(), `cube_templatecenter_trace_spans_dropped_total{reason="queue_full"}`)
		return err == nil && v > 0
	})
	p.signal(t, syscall.SIGTERM)
	if code := p.waitExit(t, shutdownTimeout+traceFlushTimeout+exitSlack); code != 0 {
		t.Errorf("agent exited %d after SIGTERM with a hung collector, want 0", code)
	}
}
