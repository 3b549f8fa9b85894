package tracing

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// W3C Trace Context header names, as CubeMaster sends and receives them.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// propagator reads and writes the W3C traceparent and tracestate headers.
var propagator = propagation.TraceContext{}

// FromHeader returns ctx carrying the remote span context of an incoming
// request's traceparent and tracestate; ctx unchanged when there is none or
// it is malformed.
func FromHeader(ctx context.Context, h http.Header) context.Context {
	return propagator.Extract(ctx, propagation.HeaderCarrier(h))
}

// Stored is a span context as the spool keeps it: the W3C header values.
type Stored struct {
	Traceparent string
	Tracestate  string
}

// Store returns the W3C form of the span context in ctx; zero when ctx
// carries no valid one.
func Store(ctx context.Context) Stored {
	c := propagation.MapCarrier{}
	propagator.Inject(ctx, c)
	return Stored{Traceparent: c[HeaderTraceparent], Tracestate: c[HeaderTracestate]}
}

// Context returns ctx carrying s as its remote parent; ctx unchanged when s
// is empty or malformed (a span started under it is then a new root).
func (s Stored) Context(ctx context.Context) context.Context {
	if s.Traceparent == "" {
		return ctx
	}
	c := propagation.MapCarrier{HeaderTraceparent: s.Traceparent}
	if s.Tracestate != "" {
		c[HeaderTracestate] = s.Tracestate
	}
	return propagator.Extract(ctx, c)
}

// SpanContext returns the span context s holds; invalid when s is empty
// or malformed.
func (s Stored) SpanContext() trace.SpanContext {
	return trace.SpanContextFromContext(s.Context(context.Background()))
}

// SetHeader writes the span context in ctx as traceparent (and
// tracestate) on h; it leaves h alone when ctx carries none.
func SetHeader(ctx context.Context, h http.Header) {
	propagator.Inject(ctx, propagation.HeaderCarrier(h))
}
