package agent

import (
	"context"
	"errors"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/tracing"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// tracerOf returns the agent's tracer; a no-op one for a nil provider.
func tracerOf(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return tp.Tracer(tracing.Scope)
}

// startSubmit starts the span of accepting a build, child of the trace
// context CubeMaster sent (a new root without one). Its context is stored
// with the job: every run of the job and every report continues it.
func (a *Agent) startSubmit(r *http.Request, b *api.Build) (trace.Span, tracing.Stored) {
	ctx := tracing.FromHeader(context.WithoutCancel(r.Context()), r.Header)
	ctx, span := a.tracer.Start(ctx, tracing.SpanSubmit, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String(tracing.AttrJobID, b.JobID), attribute.String(tracing.AttrRequestID, b.Template.RequestID),
		attribute.String(tracing.AttrTemplateID, b.Template.TemplateID), attribute.String(tracing.AttrImage, b.Template.SourceImageRef)))
	return span, tracing.Store(ctx)
}

// endSubmit ends the submit span; a job already known is no error.
func endSubmit(span trace.Span, err error) {
	if errors.Is(err, spool.ErrJobExists) {
		err = nil
	}
	tracing.End(span, err)
}
