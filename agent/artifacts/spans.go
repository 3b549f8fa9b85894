package artifacts

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/tracing"
)

// reuseSpan starts the span of one reuse decision; the returned func ends
// it with the decision.
func reuseSpan(ctx context.Context, source Source) (context.Context, func(reused bool, err error)) {
	ctx, span := tracing.Child(ctx, tracing.SpanReuse, attribute.String(tracing.AttrReuseSource, string(source)))
	return ctx, func(reused bool, err error) {
		span.SetAttributes(attribute.Bool(tracing.AttrReused, reused))
		tracing.End(span, err)
	}
}

// lockWaitSpan starts the span of waiting for the replicas' build lock;
// the returned func ends it, reused when another replica's artifact
// became READY meanwhile.
func lockWaitSpan(ctx context.Context) (context.Context, func(built *api.Built, err error)) {
	ctx, span := tracing.Child(ctx, tracing.SpanBuildLockWait)
	return ctx, func(built *api.Built, err error) {
		span.SetAttributes(attribute.Bool(tracing.AttrReused, built != nil))
		tracing.End(span, err)
	}
}

// publishSpan starts the span of putting the artifact in the blob store;
// the returned func ends it with the backend the artifact landed on. A
// fallback to the local artifact is an error on this span (the build goes
// on), with fallback=true.
func publishSpan(ctx context.Context) (context.Context, func(out *api.Built, err error)) {
	ctx, span := tracing.Child(ctx, tracing.SpanPublish)
	return ctx, func(out *api.Built, err error) {
		if out != nil {
			fellBack := out.StorageBackend == ""
			span.SetAttributes(attribute.String(tracing.AttrStorageBackend, Backend(out)), attribute.Bool(tracing.AttrFallback, fellBack))
			if fellBack && err == nil {
				span.SetStatus(codes.Error, "blob store unavailable: the local artifact is reported")
			}
		}
		tracing.End(span, err)
	}
}

// Backend names where an artifact is kept: its blob store, or local.
func Backend(b *api.Built) string {
	if b.StorageBackend == "" {
		return "local"
	}
	return b.StorageBackend
}
