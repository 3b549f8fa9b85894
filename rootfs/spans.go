package rootfs

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// Spans of a build, below the caller's span. rootfs uses only the
// OpenTelemetry API, with the tracer provider of the span in ctx: a caller
// that traces nothing gets no spans.
const (
	// SpanLayerApply is one layer's entries applied to the image tree.
	SpanLayerApply = "cubetemplatecenter.template.image.layer.apply"
	// SpanStartCheck is the start check of the complete tree, before its
	// ext4 metadata is written; its attributes are the result and the
	// number of shared libraries it found.
	SpanStartCheck = "cubetemplatecenter.template.image.start_check"
	// SpanExt4 is the ext4 metadata written, the image hashed and synced.
	SpanExt4 = "cubetemplatecenter.template.image.ext4"
)

// startSpan starts a child of the span in ctx; the returned func ends it,
// recording err with an error status.
func startSpan(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, func(err error)) {
	ctx, span := trace.SpanFromContext(ctx).TracerProvider().Tracer("github.com/cubesandbox/cubetemplatecenter/rootfs").
		Start(ctx, name, trace.WithAttributes(attrs...))
	return ctx, func(err error) {
		if err != nil {
			// The text an image shapes stays within a message's bound.
			err = safetext.ClipError(err, safetext.MessageMax)
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}
