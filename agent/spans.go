package agent

import (
	"context"
	"errors"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/tracing"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// tracerName is the instrumentation scope of the agent's spans.
const tracerName = "github.com/cubesandbox/cubetemplatecenter/agent"

// Span names; upstream's where it has one (docs/tracing.md lists them).
const (
	spanSubmit        = "cubetemplatecenter.template.image.submit"
	spanBuild         = "cubetemplatecenter.template.image.build"
	spanPrepareSource = "cubetemplatecenter.template.image.prepare_source"
	spanBuildLockWait = "cubetemplatecenter.template.image.build_lock.wait"
	spanReuse         = "cubetemplatecenter.template.image.reuse"
	spanRootfs        = "cubetemplatecenter.template.image.rootfs"
	spanPublish       = "cubetemplatecenter.template.image.artifact.publish"
	spanUpload        = "cubetemplatecenter.template.image.artifact.upload"
	spanCallback      = "cubetemplatecenter.template.image.artifact.callback"
)

// Span attribute keys.
const (
	attrRequestID      = "cube.request_id"
	attrJobID          = "cube.job_id"
	attrTemplateID     = "cube.template_id"
	attrArtifactID     = "cube.artifact_id"
	attrImage          = "cube.source_image_ref"
	attrAttempt        = "attempt"
	attrReused         = "reused"
	attrReuseSource    = "reuse.source"
	attrFallback       = "fallback"
	attrStorageBackend = "cube.storage_backend"
	attrInterrupted    = "interrupted"
	attrStatus         = "cube.status"
)

// tracerOf returns the agent's tracer; a no-op one for a nil provider.
func tracerOf(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return tp.Tracer(tracerName)
}

// startSubmit starts the span of accepting a build, child of the trace
// context CubeMaster sent (a new root without one). Its context is stored
// with the job: every run of the job and every report continues it.
func (a *Agent) startSubmit(r *http.Request, b *api.Build) (trace.Span, tracing.Stored) {
	ctx := tracing.FromHeader(context.WithoutCancel(r.Context()), r.Header)
	ctx, span := a.tracer.Start(ctx, spanSubmit, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String(attrJobID, b.JobID), attribute.String(attrRequestID, b.Template.RequestID),
		attribute.String(attrTemplateID, b.Template.TemplateID), attribute.String(attrImage, b.Template.SourceImageRef)))
	return span, tracing.Store(ctx)
}

// endSubmit ends the submit span; a job already known is no error.
func endSubmit(span trace.Span, err error) {
	if errors.Is(err, spool.ErrJobExists) {
		err = nil
	}
	endSpan(span, err)
}

// startBuild starts the span of one run of the job, child of the context
// stored with it, so a run resumed after a restart joins the same trace.
func (r *jobRun) startBuild(ctx context.Context) (context.Context, trace.Span) {
	t := &r.build.Template
	parent := tracing.Stored{Traceparent: r.job.TraceParent, Tracestate: r.job.TraceState}.Context(ctx)
	return r.e.tracer.Start(parent, spanBuild, trace.WithAttributes(
		attribute.String(attrJobID, r.job.ID), attribute.String(attrRequestID, t.RequestID),
		attribute.String(attrTemplateID, t.TemplateID), attribute.String(attrImage, t.SourceImageRef),
		attribute.Int(attrAttempt, r.job.Attempts)))
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
		span.SetAttributes(attribute.String(attrArtifactID, built.ArtifactID),
			attribute.String(attrStorageBackend, backendOf(built)))
	}
	if errors.Is(err, errStopping) || errors.Is(err, context.Canceled) {
		// Only a stop is left: the job goes back to the queue.
		span.SetAttributes(attribute.Bool(attrInterrupted, true))
		err = nil
	}
	endSpan(span, err)
}

// markReused tags the current span with whether the job got an artifact
// that already existed (or another job's build) rather than its own build.
func markReused(ctx context.Context, reused bool) {
	trace.SpanFromContext(ctx).SetAttributes(attribute.Bool(attrReused, reused))
}

// startChild starts a span below the one in ctx, from the same provider.
func startChild(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return trace.SpanFromContext(ctx).TracerProvider().Tracer(tracerName).Start(ctx, name, trace.WithAttributes(attrs...))
}

// traced runs fn under a child span named name, recording its error.
func traced[T any](ctx context.Context, name string, fn func(context.Context) (T, error), attrs ...attribute.KeyValue) (T, error) {
	ctx, span := startChild(ctx, name, attrs...)
	v, err := fn(ctx)
	endSpan(span, err)
	return v, err
}

// reuseSpan starts the span of one reuse decision (source: row, local,
// object); the returned func ends it with the decision.
func reuseSpan(ctx context.Context, source string) (context.Context, func(reused bool, err error)) {
	ctx, span := startChild(ctx, spanReuse, attribute.String(attrReuseSource, source))
	return ctx, func(reused bool, err error) {
		span.SetAttributes(attribute.Bool(attrReused, reused))
		endSpan(span, err)
	}
}

// lockWaitSpan starts the span of waiting for the replicas' build lock;
// the returned func ends it, reused when another replica's artifact
// became READY meanwhile.
func lockWaitSpan(ctx context.Context) (context.Context, func(built *api.Built, err error)) {
	ctx, span := startChild(ctx, spanBuildLockWait)
	return ctx, func(built *api.Built, err error) {
		span.SetAttributes(attribute.Bool(attrReused, built != nil))
		endSpan(span, err)
	}
}

// publishSpan starts the span of putting the artifact in the blob store;
// the returned func ends it with the backend the artifact landed on. A
// fallback to the local artifact is an error on this span (the build goes
// on), with fallback=true.
func publishSpan(ctx context.Context) (context.Context, func(out *api.Built, err error)) {
	ctx, span := startChild(ctx, spanPublish)
	return ctx, func(out *api.Built, err error) {
		if out != nil {
			fellBack := out.StorageBackend == ""
			span.SetAttributes(attribute.String(attrStorageBackend, backendOf(out)), attribute.Bool(attrFallback, fellBack))
			if fellBack && err == nil {
				span.SetStatus(codes.Error, "blob store unavailable: the local artifact is reported")
			}
		}
		endSpan(span, err)
	}
}

// callbackContext returns the trace context a terminal report carries:
// a short callback span, child of the run's span, marking the report
// queued; the reporter's attempt spans are its children.
func callbackContext(ctx context.Context, jobID string, state spool.State) tracing.Stored {
	ctx, span := startChild(ctx, spanCallback, attribute.String(attrJobID, jobID), attribute.String(attrStatus, string(state)))
	defer span.End()
	return tracing.Store(ctx)
}

// backendOf names where an artifact is kept: its blob store, or local.
func backendOf(b *api.Built) string {
	if b.StorageBackend == "" {
		return "local"
	}
	return b.StorageBackend
}

// endSpan ends span, recording err with an error status.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
