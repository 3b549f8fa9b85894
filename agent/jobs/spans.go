package jobs

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/artifacts"
	"github.com/cubesandbox/cubetemplatecenter/agent/tracing"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// startBuild starts the span of one run of the job, child of the context
// stored with it, so a run resumed after a restart joins the same trace.
func (r *jobRun) startBuild(ctx context.Context) (context.Context, trace.Span) {
	t := &r.build.Template
	parent := tracing.Stored{Traceparent: r.job.TraceParent, Tracestate: r.job.TraceState}.Context(ctx)
	return r.e.tracer.Start(parent, tracing.SpanBuild, trace.WithAttributes(
		attribute.String(tracing.AttrJobID, r.job.ID), attribute.String(tracing.AttrRequestID, t.RequestID),
		attribute.String(tracing.AttrTemplateID, t.TemplateID), attribute.String(tracing.AttrImage, t.SourceImageRef),
		attribute.Int(tracing.AttrAttempt, r.job.Attempts)))
}

// endBuild records how the run under ctx ended on its span: an error
// status for a failure, a cancel or a timeout, none for a run interrupted
// by a stop (the job goes on later).
func endBuild(ctx context.Context, span trace.Span, built *api.Built, err error) {
	var timeout buildTimeout
	if cause := context.Cause(ctx); errors.Is(cause, errCancelled) || errors.As(cause, &timeout) {
		err = cause
	}
	if built != nil {
		span.SetAttributes(attribute.String(tracing.AttrArtifactID, built.ArtifactID),
			attribute.String(tracing.AttrStorageBackend, artifacts.Backend(built)))
	}
	if errors.Is(err, errStopping) || errors.Is(err, context.Canceled) {
		// Only a stop is left: the job goes back to the queue.
		span.SetAttributes(attribute.Bool(tracing.AttrInterrupted, true))
		err = nil
	}
	tracing.End(span, err)
}

// markReused tags the current span with whether the job got an artifact
// that already existed (or another job's build) rather than its own build.
func markReused(ctx context.Context, reused bool) {
	trace.SpanFromContext(ctx).SetAttributes(attribute.Bool(tracing.AttrReused, reused))
}

// callbackContext returns the trace context a terminal report carries:
// a short callback span, child of the run's span, marking the report
// queued; the reporter's attempt spans are its children.
func callbackContext(ctx context.Context, jobID string, state spool.State) tracing.Stored {
	ctx, span := tracing.Child(ctx, tracing.SpanCallback, attribute.String(tracing.AttrJobID, jobID), attribute.String(tracing.AttrStatus, string(state)))
	defer span.End()
	return tracing.Store(ctx)
}
