package tracing

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestExporterNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want []string
		err  string // a part of the error, "" for none
	}{
		{name: "Unset", env: nil, want: nil},
		{name: "EndpointOnly", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, want: []string{"otlp/http"}},
		{name: "TracesEndpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, want: []string{"otlp/http"}},
		{name: "GRPC", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, want: []string{"otlp/grpc"}},
		{name: "TracesProtocolWins", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
			"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, want: []string{"otlp/http"}},
		{name: "None", env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, want: nil},
		{name: "Disabled", env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, want: nil},
		{name: "ConsoleAndOTLP", env: map[string]string{"OTEL_TRACES_EXPORTER": "console, otlp"}, want: []string{"console", "otlp/http"}},
		{name: "JSONProtocol", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
			err: `OTEL_EXPORTER_OTLP_PROTOCOL "http/json": supported`},
		{name: "JSONTracesProtocol", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
			err: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL "http/json": supported`},
		{name: "Unknown", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, err: "OTEL_TRACES_EXPORTER"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := exporterNames(env(tc.env))
			if (err != nil) != (tc.err != "") || err != nil && !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("exporterNames() error = %v, want an error naming %q", err, tc.err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("exporterNames() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestResource(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"Default", nil, DefaultServiceName},
		{"FromAttributes", map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "service.name=tc-a,deployment.environment=prod%20eu"}, "tc-a"},
		{"ServiceNameWins", map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "service.name=tc-a", "OTEL_SERVICE_NAME": "tc-b"}, "tc-b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := newResource(env(tc.env), "1.2.3")
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, kv := range res.Attributes() {
				got[string(kv.Key)] = kv.Value.AsString()
			}
			if got["service.name"] != tc.want || got["service.version"] != "1.2.3" {
				t.Errorf("resource = %v, want service.name %q and service.version 1.2.3", got, tc.want)
			}
			if tc.name == "FromAttributes" && got["deployment.environment"] != "prod eu" {
				t.Errorf("deployment.environment = %q, want the decoded %q", got["deployment.environment"], "prod eu")
			}
		})
	}
	if _, err := newResource(env(map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "novalue"}), ""); err == nil {
		t.Error("newResource accepted OTEL_RESOURCE_ATTRIBUTES without =")
	}
}

func TestStoredRoundTrip(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	h := http.Header{}
	h.Set("traceparent", tp)
	h.Set("tracestate", "vendor=abc")
	ctx := FromHeader(context.Background(), h)
	s := Store(ctx)
	if s.Traceparent != tp || s.Tracestate != "vendor=abc" {
		t.Fatalf("Store(FromHeader) = %+v, want the incoming headers", s)
	}
	sc := s.SpanContext()
	if sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || !sc.IsRemote() {
		t.Errorf("SpanContext() = %v, want the remote trace 4bf92f…", sc)
	}
	out := http.Header{}
	SetHeader(s.Context(context.Background()), out)
	if out.Get("traceparent") != tp {
		t.Errorf("SetHeader wrote traceparent %q, want %q", out.Get("traceparent"), tp)
	}
	if (Stored{}).SpanContext().IsValid() || (Stored{Traceparent: "garbage"}).SpanContext().IsValid() {
		t.Error("an empty or malformed Stored gave a valid span context")
	}
	if s := Store(context.Background()); s != (Stored{}) {
		t.Errorf("Store(no span) = %+v, want zero", s)
	}
}

// blockingExporter holds every export until released, as a collector that
// does not answer would.
type blockingExporter struct {
	release chan struct{}
	err     error
	mu      sync.Mutex
	got     int
}

func (b *blockingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	select {
	case <-b.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	b.mu.Lock()
	b.got += len(spans)
	b.mu.Unlock()
	return b.err
}

func (b *blockingExporter) Shutdown(context.Context) error { return nil }

// TestGateCountsDrops: with the exporter stuck, spans beyond the queue are
// dropped at once (never blocking the caller) and counted; spans of a batch
// the exporter fails are counted as export_failed; none is lost uncounted.
func TestGateCountsDrops(t *testing.T) {
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dropped_total", Help: "h"}, []string{"reason"})
	exp := &blockingExporter{release: make(chan struct{}), err: errors.New("collector unreachable")}
	const queue = 4
	g := &gate{limit: queue, queueFull: dropped.WithLabelValues(DropQueueFull)}
	g.SpanProcessor = sdktrace.NewBatchSpanProcessor(&countingExporter{SpanExporter: exp, gate: g,
		failed: dropped.WithLabelValues(DropExportFailed)}, sdktrace.WithMaxQueueSize(queue), sdktrace.WithMaxExportBatchSize(2))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(g))
	tr := tp.Tracer("test")
	const spans = 10
	for range spans {
		_, s := tr.Start(context.Background(), "s")
		s.End()
	}
	if got := testutil.ToFloat64(dropped.WithLabelValues(DropQueueFull)); got != spans-queue {
		t.Errorf("queue_full = %v, want %d", got, spans-queue)
	}
	close(exp.release)
	if err := tp.Shutdown(context.Background()); err == nil {
		t.Log("shutdown reported no export error") // the failure is counted below either way
	}
	if got := testutil.ToFloat64(dropped.WithLabelValues(DropExportFailed)); got != queue {
		t.Errorf("export_failed = %v, want %d (every admitted span, its batch failed)", got, queue)
	}
	if p := g.pending.Load(); p != 0 {
		t.Errorf("pending after shutdown = %d, want 0", p)
	}
}

// TestSetupWithoutExporter: no exporter configured, spans still get ids
// (a job's trace id is propagated to CubeMaster) and a child inherits the
// stored parent's trace.
func TestSetupWithoutExporter(t *testing.T) {
	p, err := Setup(context.Background(), Options{Getenv: env(nil), Version: "v"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	if len(p.Exporters()) != 0 {
		t.Errorf("Exporters() = %q, want none", p.Exporters())
	}
	var tp trace.TracerProvider = p
	parent := Stored{Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	_, s := tp.Tracer("t").Start(parent.Context(context.Background()), "child")
	defer s.End()
	if got := s.SpanContext().TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("child trace id = %s, want the stored parent's", got)
	}
	if n := testutil.CollectAndCount(p.Collectors()[0]); n != 2 {
		t.Errorf("drop counter has %d series, want 2 (both reasons from the start)", n)
	}
}

// TestSetupExporters: gRPC and console exporters are built from the
// variables alone (neither connects at start), and the console one writes
// ended spans to the writer main gives it.
func TestSetupExporters(t *testing.T) {
	ctx := context.Background()
	p, err := Setup(ctx, Options{Getenv: env(map[string]string{"OTEL_TRACES_EXPORTER": "otlp",
		"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})})
	if err != nil {
		t.Fatalf("Setup(grpc): %v", err)
	}
	if got := p.Exporters(); !slices.Equal(got, []string{"otlp/grpc"}) {
		t.Errorf("Exporters() = %q, want otlp/grpc", got)
	}
	shutdownCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	p.Shutdown(shutdownCtx)

	var out bytes.Buffer
	p, err = Setup(ctx, Options{Getenv: env(map[string]string{"OTEL_TRACES_EXPORTER": "console"}), Console: &out})
	if err != nil {
		t.Fatalf("Setup(console): %v", err)
	}
	_, s := p.Tracer("t").Start(ctx, "console-span")
	s.End()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "console-span") || !strings.Contains(out.String(), DefaultServiceName) {
		t.Errorf("console output lacks the span or the service name:\n%s", out.String())
	}
	if _, err := Setup(ctx, Options{Getenv: env(map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "-1"})}); err == nil {
		t.Error("Setup accepted OTEL_BSP_MAX_QUEUE_SIZE=-1")
	}
}
