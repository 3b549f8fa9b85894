package oci

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// SpanLayerFetch is the span of making one layer blob available: from the
// layer cache, or downloaded into it.
const SpanLayerFetch = "cubetemplatecenter.template.image.layer.fetch"

// layerSpan starts the fetch span of layer l (index i in the manifest)
// under the caller's span, from the caller's tracer provider: none when the
// caller traces nothing.
func layerSpan(ctx context.Context, i int, l Layer) (context.Context, func(fromCache bool, err error)) {
	ctx, span := trace.SpanFromContext(ctx).TracerProvider().Tracer("github.com/cubesandbox/cubetemplatecenter/rootfs").
		Start(ctx, SpanLayerFetch, trace.WithAttributes(attribute.String("oci.layer.digest", l.Digest.String()),
			attribute.Int("oci.layer.index", i), attribute.Int64("oci.layer.size", l.Size)))
	return ctx, func(fromCache bool, err error) {
		span.SetAttributes(attribute.Bool("cache_hit", fromCache))
		if err != nil {
			// The text an image shapes stays within a message's bound.
			err = safetext.ClipError(err, safetext.MessageMax)
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

// Events of the layer fetch span.
const (
	// EventLayerResume marks a download continuing where a dropped
	// connection left it: oci.layer.offset is where, oci.layer.skipped the
	// bytes the place sent again (a registry ignoring Range).
	EventLayerResume = "oci.layer.resume"
	// EventLayerTurn marks the moment the layer's body started to be
	// read: the gate granted its first stream (the layers below it were
	// complete, or left streams to spare).
	EventLayerTurn = "oci.layer.turn"
	// EventLayerChunk marks a range of the layer written in full by one
	// stream: oci.layer.offset, oci.layer.length, and
	// oci.layer.connection, the stream's index (0 is the first). A fetch
	// span has at most maxLayerEvents events; its attributes
	// oci.layer.connections and oci.layer.chunks count them all.
	EventLayerChunk = "oci.layer.chunk"
)

// spanEvent adds an event to the span of ctx, when it is recording.
func spanEvent(ctx context.Context, name string, attrs ...attribute.KeyValue) {
	trace.SpanFromContext(ctx).AddEvent(name, trace.WithAttributes(attrs...))
}
