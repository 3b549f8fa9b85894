package report

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/cubesandbox/cubetemplatecenter/agent/tracing"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// Span names of terminal report deliveries, as upstream names them.
const (
	SpanAttempt = "cubetemplatecenter.template.image.artifact.report.attempt"
	SpanBackoff = "cubetemplatecenter.template.image.artifact.report.backoff"
)

// TracerName is the instrumentation scope of the reporter's spans.
const TracerName = "github.com/cubesandbox/cubetemplatecenter/agent/report"

// tracerOf returns the reporter's tracer; a no-op one for a nil provider.
func tracerOf(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return tp.Tracer(TracerName)
}

// traceContext returns ctx under the trace context rep carries and, for a
// terminal report, the span of this attempt, child of it: the callback's
// traceparent. Progress reports get no span of their own; their callback
// carries the stored context itself.
func (r *Reporter) traceContext(ctx context.Context, rep spool.Report) (context.Context, trace.Span) {
	ctx = tracing.Stored{Traceparent: rep.TraceParent, Tracestate: rep.TraceState}.Context(ctx)
	if !rep.Terminal {
		return ctx, nil
	}
	return r.tracer.Start(ctx, SpanAttempt, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("cube.job_id", rep.JobID), attribute.Int("attempt", rep.Attempts+1)))
}

// endAttempt ends the span of one attempt with its HTTP status and, when it
// did not deliver the report, an error status.
func endAttempt(span trace.Span, status int, err error, reason string) {
	if span == nil {
		return
	}
	if status != 0 {
		span.SetAttributes(attribute.Int("http.response.status_code", status))
	}
	switch {
	case err != nil:
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	case status/100 != 2:
		span.SetStatus(codes.Error, reason)
	}
	span.End()
}

// recordBackoff records the wait before a terminal report's next attempt.
// The wait is spent in the outbox, not in a goroutine that could hold a
// span open (it survives a restart), so the span marks when the retry was
// scheduled and wait_ms says for how long.
func (r *Reporter) recordBackoff(ctx context.Context, rep spool.Report, wait time.Duration) {
	if !rep.Terminal {
		return
	}
	_, span := r.tracer.Start(tracing.Stored{Traceparent: rep.TraceParent, Tracestate: rep.TraceState}.Context(ctx),
		SpanBackoff, trace.WithAttributes(attribute.String("cube.job_id", rep.JobID),
			attribute.Int("attempt", rep.Attempts+1), attribute.Int64("wait_ms", wait.Milliseconds())))
	span.End()
}

// setTraceHeaders writes the callback's traceparent: the span context in
// ctx, or, for a report queued by a release that stored none, a fresh one.
func setTraceHeaders(ctx context.Context, h http.Header) {
	if trace.SpanContextFromContext(ctx).IsValid() {
		tracing.SetHeader(ctx, h)
		return
	}
	var b [24]byte
	rand.Read(b[:])
	h.Set(tracing.HeaderTraceparent, "00-"+hex.EncodeToString(b[:16])+"-"+hex.EncodeToString(b[16:])+"-01")
}
