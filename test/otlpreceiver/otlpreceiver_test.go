package otlpreceiver

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// TestReceivesExportedSpans: spans the SDK's OTLP/HTTP exporter sends, gzip
// compressed, arrive decoded with their links, status and attributes.
func TestReceivesExportedSpans(t *testing.T) {
	r := Start()
	defer r.Close()
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(r.URL()+"/v1/traces"),
		otlptracehttp.WithCompression(otlptracehttp.GzipCompression))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "svc"))))
	ctx, parent := tp.Tracer("t").Start(context.Background(), "parent")
	_, child := tp.Tracer("t").Start(ctx, "child")
	child.SetAttributes(attribute.Int("attempt", 2))
	child.SetStatus(codes.Error, "broke")
	child.End()
	parent.End()
	wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	spans, err := r.WaitFor(wctx, func(s []Span) bool { return len(s) == 2 })
	if err != nil {
		t.Fatal(err)
	}
	c, p := spans[0], spans[1]
	if c.Name != "child" || p.Name != "parent" || c.ParentSpanID != p.SpanID || c.TraceID != p.TraceID {
		t.Errorf("spans = %+v, want child under parent in one trace", spans)
	}
	if !c.Error || c.Message != "broke" || c.Attrs["attempt"] != "2" || c.Resource["service.name"] != "svc" {
		t.Errorf("child = %+v, want Error \"broke\", attempt 2, service.name svc", c)
	}
	tp.Shutdown(context.Background())
}
