package report

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/cubesandbox/cubetemplatecenter/spool"
	"github.com/cubesandbox/cubetemplatecenter/test/cubemaster"
)

const (
	jobTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	jobParent  = "00-" + jobTraceID + "-00f067aa0ba902b7-01"
)

// TestCallbacksContinueTheJobTrace: progress callbacks carry the job's
// stored trace context; a BUILT refused once with 503 and then accepted
// makes two attempt spans (the first an error) and one backoff span with
// wait_ms, and each BUILT callback's traceparent is its attempt span.
func TestCallbacksContinueTheJobTrace(t *testing.T) {
	ctx := context.Background()
	sp, err := spool.Open(ctx, filepath.Join(t.TempDir(), "spool.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	master, err := cubemaster.Start("")
	if err != nil {
		t.Fatal(err)
	}
	defer master.Stop()
	var mu sync.Mutex
	refuse := 1
	master.Respond(func(jobID string, body map[string]any) int {
		mu.Lock()
		defer mu.Unlock()
		if body["status"] == "BUILT" && refuse > 0 {
			refuse--
			return http.StatusServiceUnavailable
		}
		return 0
	})
	if _, err := sp.Enqueue(ctx, spool.NewJob{ID: "j", Request: []byte("{}"), TraceParent: jobParent}, 10); err != nil {
		t.Fatal(err)
	}
	if err := sp.AddReport(ctx, "j", spool.Report{Kind: spool.KindStatus, Body: []byte(`{"status":"RUNNING"}`)}); err != nil {
		t.Fatal(err)
	}
	if err := sp.Finish(ctx, "j", spool.StateBuilt, "READY", "", spool.Report{Kind: spool.KindTerminal, Body: []byte(`{"status":"BUILT"}`)}); err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	r := New(sp, func() Settings {
		return Settings{BaseURL: master.URL(), Timeout: time.Second, RetryInitial: 10 * time.Millisecond,
			RetryMax: 10 * time.Millisecond, ProgressAttempts: 3}
	}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, tp)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go r.Run(runCtx)
	waitCtx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if _, err := master.WaitTerminal(waitCtx, "j"); err != nil {
		t.Fatalf("WaitTerminal: %v", err)
	}
	// The last attempt span ends once the answer is read.
	for len(rec.Ended()) < 3 && waitCtx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()

	cbs := master.All()
	if len(cbs) != 3 {
		t.Fatalf("got %d callbacks, want RUNNING, BUILT refused, BUILT", len(cbs))
	}
	if cbs[0].Traceparent != jobParent {
		t.Errorf("RUNNING callback traceparent = %q, want the job's %q", cbs[0].Traceparent, jobParent)
	}
	var attempts, backoffs []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case SpanAttempt:
			attempts = append(attempts, s)
		case SpanBackoff:
			backoffs = append(backoffs, s)
		default:
			t.Errorf("unexpected span %q", s.Name())
		}
	}
	if len(attempts) != 2 || len(backoffs) != 1 {
		t.Fatalf("got %d attempt and %d backoff spans, want 2 and 1", len(attempts), len(backoffs))
	}
	for i, s := range attempts {
		if got := s.SpanContext().TraceID().String(); got != jobTraceID {
			t.Errorf("attempt %d trace = %s, want the job's %s", i+1, got, jobTraceID)
		}
		if got := s.Parent().SpanID().String(); got != "00f067aa0ba902b7" {
			t.Errorf("attempt %d parent = %s, want the job's stored span", i+1, got)
		}
		want := "00-" + jobTraceID + "-" + s.SpanContext().SpanID().String() + "-01"
		if cbs[i+1].Traceparent != want {
			t.Errorf("BUILT callback %d traceparent = %q, want its attempt span %q", i+1, cbs[i+1].Traceparent, want)
		}
		if a := attrs(s); a["attempt"] != int64(i+1) {
			t.Errorf("attempt span %d has attempt=%v", i+1, a["attempt"])
		}
	}
	if st := attempts[0].Status(); st.Code != codes.Error || attrs(attempts[0])["http.response.status_code"] != int64(503) {
		t.Errorf("refused attempt: status %v, attributes %v; want Error and 503", st, attrs(attempts[0]))
	}
	if st := attempts[1].Status(); st.Code == codes.Error || attrs(attempts[1])["http.response.status_code"] != int64(200) {
		t.Errorf("delivered attempt: status %v, attributes %v; want no error and 200", st, attrs(attempts[1]))
	}
	if w := attrs(backoffs[0])["wait_ms"]; w != int64(10) {
		t.Errorf("backoff wait_ms = %v, want 10", w)
	}
	if !strings.HasPrefix(cbs[1].Traceparent, "00-"+jobTraceID) {
		t.Errorf("refused BUILT traceparent = %q, not of the job's trace", cbs[1].Traceparent)
	}
}

// attrs maps a span's attributes to their values.
func attrs(s sdktrace.ReadOnlySpan) map[string]any {
	out := map[string]any{}
	for _, kv := range s.Attributes() {
		out[string(kv.Key)] = attrValue(kv.Value)
	}
	return out
}

func attrValue(v attribute.Value) any {
	switch v.Type() {
	case attribute.INT64:
		return v.AsInt64()
	case attribute.BOOL:
		return v.AsBool()
	default:
		return v.AsString()
	}
}
