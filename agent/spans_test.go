package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/test/wait"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
	"github.com/cubesandbox/cubetemplatecenter/agent/tracing"
)

const (
	incomingTraceID = "0af7651916cd43dd8448eb211c80319c"
	incomingParent  = "00-" + incomingTraceID + "-b7ad6b7169203331-01"
)

// submitTraced posts a build with a W3C traceparent, as CubeMaster does.
func (h *harness) submitTraced(id, ref, traceparent string) {
	h.t.Helper()
	data, err := json.Marshal(buildBody(id, ref))
	if err != nil {
		h.t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, h.url+"/tc/api/v1/build", bytes.NewReader(data))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(api.TokenHeader, testToken)
	req.Header.Set("traceparent", traceparent)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		h.t.Fatalf("submit %s: HTTP %d", id, resp.StatusCode)
	}
}

// spansByName indexes ended spans by name (the last of each name wins).
func spansByName(spans []sdktrace.ReadOnlySpan) map[string]sdktrace.ReadOnlySpan {
	out := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		out[s.Name()] = s
	}
	return out
}

func attrOf(s sdktrace.ReadOnlySpan, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// TestBuildSpans: a build submitted with a traceparent makes the submit,
// build, phase and callback spans of that trace, linked as documented,
// and every callback of the job carries a traceparent of that trace. A
// second job of the same image reuses the artifact: its build span says
// reused=true.
func TestBuildSpans(t *testing.T) {
	h := newHarness(t, nil)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	h.tracer = tp
	h.start()
	h.submitTraced("job-1", "registry.local/app:1", incomingParent)
	h.terminal("job-1")
	h.stop()

	var mine []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanContext().TraceID().String() == incomingTraceID {
			mine = append(mine, s)
		}
	}
	byName := spansByName(mine)
	for _, name := range []string{tracing.SpanSubmit, tracing.SpanBuild, tracing.SpanPrepareSource, tracing.SpanReuse, tracing.SpanRootfs, tracing.SpanCallback,
		"cubetemplatecenter.template.image.artifact.report.attempt"} {
		if _, ok := byName[name]; !ok {
			t.Errorf("no %s span in the incoming trace", name)
		}
	}
	if t.Failed() {
		for _, s := range rec.Ended() {
			t.Logf("span %s trace %s", s.Name(), s.SpanContext().TraceID())
		}
		t.FailNow()
	}
	parentOf := func(name string) string { return byName[name].Parent().SpanID().String() }
	idOf := func(name string) string { return byName[name].SpanContext().SpanID().String() }
	if got := parentOf(tracing.SpanSubmit); got != "b7ad6b7169203331" {
		t.Errorf("submit span parent = %s, want the incoming span", got)
	}
	if got := parentOf(tracing.SpanBuild); got != idOf(tracing.SpanSubmit) {
		t.Errorf("build span parent = %s, want the submit span %s", got, idOf(tracing.SpanSubmit))
	}
	for _, name := range []string{tracing.SpanPrepareSource, tracing.SpanRootfs, tracing.SpanCallback} {
		if got := parentOf(name); got != idOf(tracing.SpanBuild) {
			t.Errorf("%s parent = %s, want the build span %s", name, got, idOf(tracing.SpanBuild))
		}
	}
	if got := parentOf("cubetemplatecenter.template.image.artifact.report.attempt"); got != idOf(tracing.SpanCallback) {
		t.Errorf("report attempt parent = %s, want the callback span %s", got, idOf(tracing.SpanCallback))
	}
	build := byName[tracing.SpanBuild]
	for key, want := range map[string]string{tracing.AttrJobID: "job-1", tracing.AttrImage: "registry.local/app:1", tracing.AttrStorageBackend: "local"} {
		if v, _ := attrOf(build, key); v.AsString() != want {
			t.Errorf("build span %s = %q, want %q", key, v.AsString(), want)
		}
	}
	if v, ok := attrOf(build, tracing.AttrRequestID); !ok || v.AsString() == "" {
		t.Errorf("build span has no %s", tracing.AttrRequestID)
	}
	if v, _ := attrOf(build, tracing.AttrReused); v.AsBool() {
		t.Error("first build span says reused=true")
	}
	if build.Status().Code == codes.Error {
		t.Errorf("build span status = %v, want no error", build.Status())
	}
	cbs := h.master.All()
	if len(cbs) == 0 {
		t.Fatal("no callbacks")
	}
	for _, cb := range cbs {
		if !strings.HasPrefix(cb.Traceparent, "00-"+incomingTraceID+"-") {
			t.Errorf("callback %v carries traceparent %q, not of trace %s", cb.Body["status"], cb.Traceparent, incomingTraceID)
		}
	}
}

// TestBuildSpansReuseAndFailure: without a traceparent the job gets a
// trace of its own; a reuse is tagged on the build span, a failure is an
// error on it and on the phase that failed.
func TestBuildSpansReuseAndFailure(t *testing.T) {
	h := newHarness(t, nil)
	rec := tracetest.NewSpanRecorder()
	h.tracer = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	h.start()
	h.submit("first", "registry.local/app:1")
	h.terminal("first")
	h.submit("again", "registry.local/app:1")
	h.terminal("again")
	h.builder.mu.Lock()
	h.builder.resolveErr = errTestResolve
	h.builder.mu.Unlock()
	h.submit("broken", "registry.local/app:2")
	h.terminal("broken")
	h.stop()

	traces := map[string]string{} // job id -> trace id
	builds := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		if s.Name() == tracing.SpanBuild {
			v, _ := attrOf(s, tracing.AttrJobID)
			builds[v.AsString()] = s
			traces[v.AsString()] = s.SpanContext().TraceID().String()
		}
	}
	if len(traces) != 3 || traces["first"] == traces["again"] || traces["first"] == traces["broken"] {
		t.Errorf("build traces = %v, want one trace per job", traces)
	}
	if v, _ := attrOf(builds["again"], tracing.AttrReused); !v.AsBool() {
		t.Error("the second build of the image is not tagged reused=true")
	}
	if st := builds["broken"].Status(); st.Code != codes.Error || !strings.Contains(st.Description, "resolve image") {
		t.Errorf("failed build span status = %v, want Error naming the resolve", st)
	}
	var prepFailed bool
	for _, s := range rec.Ended() {
		if s.Name() == tracing.SpanPrepareSource && s.SpanContext().TraceID().String() == traces["broken"] {
			prepFailed = s.Status().Code == codes.Error && len(s.Events()) > 0
		}
	}
	if !prepFailed {
		t.Error("the failed prepare_source span has no error status and recorded error")
	}
	for _, cb := range h.master.All() {
		if tr := traces[cb.JobID]; tr == "" || !strings.HasPrefix(cb.Traceparent, "00-"+tr+"-") {
			t.Errorf("callback of %s (%v) carries %q, not its trace %q", cb.JobID, cb.Body["status"], cb.Traceparent, tr)
		}
	}
}

var errTestResolve = errors.New("registry.test: unexpected status 404")

// TestPublishSpanFallback: the blob store refusing the artifact falls back
// to the local one; the publish span is an error with fallback=true and the
// local backend, while the build goes on.
func TestPublishSpanFallback(t *testing.T) {
	store, _ := s3Store(t, func(o *blobstore.S3Options) { o.SecretAccessKey = "wrong-secret-for-the-test" })
	h := newHarness(t, nil)
	rec := tracetest.NewSpanRecorder()
	h.tracer = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	h.objects = store
	h.start()
	h.submit("fallback", "registry.local/app:1")
	if cb := h.terminal("fallback"); cb.Field("status") != "BUILT" || cb.Field("object_key") != "" {
		t.Fatalf("terminal report = %v, want BUILT with the local artifact only", cb.Body)
	}
	h.stop()
	byName := spansByName(rec.Ended())
	pub, ok := byName[tracing.SpanPublish]
	if !ok {
		t.Fatal("no publish span")
	}
	if pub.Status().Code != codes.Error {
		t.Errorf("publish span status = %v, want Error", pub.Status())
	}
	if v, _ := attrOf(pub, tracing.AttrFallback); !v.AsBool() {
		t.Error("publish span has no fallback=true")
	}
	if v, _ := attrOf(pub, tracing.AttrStorageBackend); v.AsString() != "local" {
		t.Errorf("publish span backend = %q, want local", v.AsString())
	}
	if up, ok := byName[tracing.SpanUpload]; ok && (up.Status().Code != codes.Error || up.Parent().SpanID() != pub.SpanContext().SpanID()) {
		t.Errorf("upload span status %v, parent %s; want Error under the publish span", up.Status(), up.Parent().SpanID())
	}
}

// TestBuildSpanCancelled: a job cancelled mid-build ends its build span
// with an error, not as an interrupted run.
func TestBuildSpanCancelled(t *testing.T) {
	h := newHarness(t, nil)
	rec := tracetest.NewSpanRecorder()
	h.tracer = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	entered, release := h.pauseAtPublish()
	defer close(release)
	h.start()
	h.submit("cancel-me", "registry.local/app:1")
	<-entered
	if code, body := h.post("/tc/api/v1/jobs/cancel-me/cancel", nil); code != http.StatusOK {
		t.Fatalf("cancel: %d %v", code, body)
	}
	h.terminal("cancel-me")
	var build sdktrace.ReadOnlySpan
	wait.For(t, "the build span to end", func() bool {
		build = spansByName(rec.Ended())[tracing.SpanBuild]
		return build != nil
	})
	if build.Status().Code != codes.Error || build.Status().Description != "cancelled" {
		t.Errorf("cancelled build span status = %v, want Error \"cancelled\"", build.Status())
	}
	if v, ok := attrOf(build, tracing.AttrInterrupted); ok && v.AsBool() {
		t.Error("cancelled build span says interrupted=true")
	}
}

// TestLockWaitSpan: a replica that waits for another's build lock records
// the wait under its build span, and its build span says it reused the
// other replica's artifact.
func TestLockWaitSpan(t *testing.T) {
	rs := newReplicaSet(t, dbDialects[0])
	rec := tracetest.NewSpanRecorder()
	rs.tracer = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	a, b := rs.replica(true, nil), rs.replica(true, nil)
	close(rs.contend(a, b))
	if cb := b.terminal("job-b"); cb.Field("status") != "BUILT" {
		t.Fatalf("B ended %v", cb.Body)
	}
	var build sdktrace.ReadOnlySpan
	wait.For(t, "B's build span", func() bool {
		for _, s := range rec.Ended() {
			if v, _ := attrOf(s, tracing.AttrJobID); s.Name() == tracing.SpanBuild && v.AsString() == "job-b" {
				build = s
			}
		}
		return build != nil
	})
	if v, _ := attrOf(build, tracing.AttrReused); !v.AsBool() {
		t.Error("B's build span does not say reused=true")
	}
	var wait sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == tracing.SpanBuildLockWait && s.Parent().SpanID() == build.SpanContext().SpanID() {
			wait = s
		}
	}
	if wait == nil {
		t.Fatal("no build_lock.wait span under B's build span")
	}
	if d := wait.EndTime().Sub(wait.StartTime()); d < 50*time.Millisecond || wait.Status().Code == codes.Error {
		t.Errorf("B's lock wait span lasted %s with status %v; want the wait (at least one poll interval), no error", d, wait.Status())
	}
}
