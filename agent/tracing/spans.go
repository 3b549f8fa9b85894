package tracing

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// Scope is the instrumentation scope of the agent's spans.
const Scope = "github.com/cubesandbox/cubetemplatecenter/agent"

// Span names; upstream's where it has one (docs/observability.md lists them).
const (
	SpanSubmit        = "cubetemplatecenter.template.image.submit"
	SpanBuild         = "cubetemplatecenter.template.image.build"
	SpanPrepareSource = "cubetemplatecenter.template.image.prepare_source"
	SpanBuildLockWait = "cubetemplatecenter.template.image.build_lock.wait"
	SpanReuse         = "cubetemplatecenter.template.image.reuse"
	SpanRootfs        = "cubetemplatecenter.template.image.rootfs"
	SpanPublish       = "cubetemplatecenter.template.image.artifact.publish"
	SpanUpload        = "cubetemplatecenter.template.image.artifact.upload"
	SpanCallback      = "cubetemplatecenter.template.image.artifact.callback"
)

// Span attribute keys.
const (
	AttrRequestID      = "cube.request_id"
	AttrJobID          = "cube.job_id"
	AttrTemplateID     = "cube.template_id"
	AttrArtifactID     = "cube.artifact_id"
	AttrImage          = "cube.source_image_ref"
	AttrAttempt        = "attempt"
	AttrReused         = "reused"
	AttrReuseSource    = "reuse.source"
	AttrFallback       = "fallback"
	AttrStorageBackend = "cube.storage_backend"
	AttrInterrupted    = "interrupted"
	AttrStatus         = "cube.status"
)

// Child starts a span below the one in ctx, from the same provider: a
// package deep in a build needs no tracer of its own.
func Child(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return trace.SpanFromContext(ctx).TracerProvider().Tracer(Scope).Start(ctx, name, trace.WithAttributes(attrs...))
}

// Run runs fn under a child span named name, recording its error.
func Run[T any](ctx context.Context, name string, fn func(context.Context) (T, error), attrs ...attribute.KeyValue) (T, error) {
	ctx, span := Child(ctx, name, attrs...)
	v, err := fn(ctx)
	End(span, err)
	return v, err
}

// End ends span, recording err with an error status. The error's text,
// which an image can shape, is cut to safetext.MessageMax.
func End(span trace.Span, err error) {
	if err != nil {
		err = safetext.ClipError(err, safetext.MessageMax)
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
