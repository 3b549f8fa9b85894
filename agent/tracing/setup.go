package tracing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// DefaultServiceName is service.name when neither OTEL_SERVICE_NAME nor
// OTEL_RESOURCE_ATTRIBUTES names one.
const DefaultServiceName = "cube-templatecenter"

// Defaults of the export queue, as the OpenTelemetry specification sets
// them for OTEL_BSP_MAX_QUEUE_SIZE and OTEL_BSP_MAX_EXPORT_BATCH_SIZE.
const (
	defaultQueueSize = 2048
	defaultBatchSize = 512
)

// Reasons a span is dropped, the reason label of the drop counter.
const (
	DropQueueFull    = "queue_full"
	DropExportFailed = "export_failed"
)

// Options tell Setup where to read its settings.
type Options struct {
	// Getenv reads the OTEL_* variables that choose the exporter, the
	// protocol, the queue and the resource. The OTLP exporters read their
	// own OTEL_EXPORTER_OTLP_* settings (endpoint, headers, timeout,
	// compression, TLS) from the process environment: the library offers
	// no other source.
	Getenv func(string) string
	// Version is service.version.
	Version string
	// Console receives spans when OTEL_TRACES_EXPORTER names console.
	Console io.Writer
}

// Provider is the process's tracer provider. Spans are always made, so
// that every job has a trace id to propagate; they leave the process only
// through the exporters the environment names, never blocking the caller:
// a span that finds the export queue full is dropped and counted.
type Provider struct {
	*sdktrace.TracerProvider
	exporters []string
	dropped   *prometheus.CounterVec
}

// Setup builds the provider the OTEL_* variables describe. With no
// exporter (OTEL_SDK_DISABLED=true, OTEL_TRACES_EXPORTER=none, or neither
// it nor an OTLP endpoint set) spans are kept only while they are open.
func Setup(ctx context.Context, o Options) (*Provider, error) {
	getenv := o.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	p := &Provider{dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "cube_templatecenter", Subsystem: "trace", Name: "spans_dropped_total",
		Help: "Finished spans that never reached the trace collector: the export queue was full (queue_full), " +
			"or the exporter gave up on their batch (export_failed).",
	}, []string{"reason"})}
	for _, r := range []string{DropQueueFull, DropExportFailed} {
		p.dropped.WithLabelValues(r)
	}
	res, err := newResource(getenv, o.Version)
	if err != nil {
		return nil, err
	}
	names, err := exporterNames(getenv)
	if err != nil {
		return nil, err
	}
	queue, err := positiveEnv(getenv, "OTEL_BSP_MAX_QUEUE_SIZE", defaultQueueSize)
	if err != nil {
		return nil, err
	}
	batch, err := positiveEnv(getenv, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", defaultBatchSize)
	if err != nil {
		return nil, err
	}
	batch = min(batch, queue)
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	for _, name := range names {
		exp, err := newExporter(ctx, name, getenv, o.Console)
		if err != nil {
			return nil, err
		}
		g := &gate{limit: int64(queue), queueFull: p.dropped.WithLabelValues(DropQueueFull)}
		counted := &countingExporter{SpanExporter: exp, gate: g, failed: p.dropped.WithLabelValues(DropExportFailed)}
		// The gate admits no more spans than the queue holds, so the
		// batch processor never drops one uncounted.
		g.SpanProcessor = sdktrace.NewBatchSpanProcessor(counted,
			sdktrace.WithMaxQueueSize(queue), sdktrace.WithMaxExportBatchSize(batch))
		opts = append(opts, sdktrace.WithSpanProcessor(g))
		p.exporters = append(p.exporters, name)
	}
	p.TracerProvider = sdktrace.NewTracerProvider(opts...)
	return p, nil
}

// Exporters names the exporters spans go to (otlp/http, otlp/grpc,
// console); none when spans are not exported.
func (p *Provider) Exporters() []string { return p.exporters }

// Collectors returns the provider's Prometheus series.
func (p *Provider) Collectors() []prometheus.Collector { return []prometheus.Collector{p.dropped} }

// exporterNames reads OTEL_SDK_DISABLED and OTEL_TRACES_EXPORTER, and
// returns each exporter with its protocol (otlp/http, otlp/grpc, console).
// Unset, OTEL_TRACES_EXPORTER means otlp when an OTLP endpoint is set, and
// none otherwise, so that a host without a collector sends nothing.
func exporterNames(getenv func(string) string) ([]string, error) {
	if v := strings.TrimSpace(getenv("OTEL_SDK_DISABLED")); strings.EqualFold(v, "true") {
		return nil, nil
	}
	list := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER"))
	if list == "" {
		if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return nil, nil
		}
		list = "otlp"
	}
	var out []string
	for _, name := range strings.Split(list, ",") {
		switch name = strings.ToLower(strings.TrimSpace(name)); name {
		case "none":
			return nil, nil
		case "console":
			out = append(out, "console")
		case "otlp":
			// The error names the variable that set the value.
			protoVar := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
			proto := strings.TrimSpace(getenv(protoVar))
			if proto == "" {
				protoVar = "OTEL_EXPORTER_OTLP_PROTOCOL"
				proto = strings.TrimSpace(getenv(protoVar))
			}
			switch proto {
			case "", "http/protobuf":
				out = append(out, "otlp/http")
			case "grpc":
				out = append(out, "otlp/grpc")
			default:
				return nil, fmt.Errorf("%s %s: supported are http/protobuf and grpc", protoVar, safetext.Name(proto))
			}
		default:
			return nil, fmt.Errorf("OTEL_TRACES_EXPORTER %s: supported are otlp, console and none", safetext.Name(name))
		}
	}
	return out, nil
}

func newExporter(ctx context.Context, name string, getenv func(string) string, console io.Writer) (sdktrace.SpanExporter, error) {
	switch name {
	case "otlp/http":
		exp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("set up OTLP/HTTP trace exporter: %w", err)
		}
		return exp, nil
	case "otlp/grpc":
		exp, err := otlptracegrpc.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("set up OTLP/gRPC trace exporter: %w", err)
		}
		return exp, nil
	case "console":
		if console == nil {
			console = io.Discard
		}
		exp, err := stdouttrace.New(stdouttrace.WithWriter(console))
		if err != nil {
			return nil, fmt.Errorf("set up console trace exporter: %w", err)
		}
		return exp, nil
	}
	return nil, fmt.Errorf("unknown trace exporter %q", name)
}

// newResource describes this process: OTEL_RESOURCE_ATTRIBUTES, then
// service.name from OTEL_SERVICE_NAME (or DefaultServiceName when neither
// names it), service.version and process.pid (a restarted agent's spans
// tell themselves apart by it).
func newResource(getenv func(string) string, version string) (*resource.Resource, error) {
	attrs, err := parseResourceAttributes(getenv("OTEL_RESOURCE_ATTRIBUTES"))
	if err != nil {
		return nil, err
	}
	name := strings.TrimSpace(getenv("OTEL_SERVICE_NAME"))
	if name == "" {
		name = DefaultServiceName
		for _, a := range attrs {
			if a.Key == "service.name" {
				name = a.Value.AsString()
			}
		}
	}
	attrs = append(attrs, attribute.String("service.name", name))
	if version != "" {
		attrs = append(attrs, attribute.String("service.version", version))
	}
	attrs = append(attrs, attribute.Int("process.pid", os.Getpid()))
	return resource.NewSchemaless(attrs...), nil
}

// parseResourceAttributes reads OTEL_RESOURCE_ATTRIBUTES: comma-separated
// key=value pairs, values percent-encoded.
func parseResourceAttributes(s string) ([]attribute.KeyValue, error) {
	var out []attribute.KeyValue
	for _, pair := range strings.Split(s, ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %q is not key=value", pair)
		}
		val, err := url.PathUnescape(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: value of %s: %w", k, err)
		}
		out = append(out, attribute.String(k, val))
	}
	return out, nil
}

// positiveEnv reads a positive integer variable, def when unset.
func positiveEnv(getenv func(string) string, key string, def int) (int, error) {
	v := strings.TrimSpace(getenv(key))
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%s %q: want a positive integer", key, v)
	}
	return n, nil
}

// gate admits a finished span to the batch processor only while fewer than
// limit admitted spans are still unexported (queued or in the batch being
// sent), and counts the others as dropped. The batch processor drops a
// span silently when its queue is full; with the gate in front it never
// gets the chance, so every lost span is counted here or by the exporter.
type gate struct {
	sdktrace.SpanProcessor
	limit     int64
	pending   atomic.Int64
	queueFull prometheus.Counter
}

// OnEnd hands s on when there is room, without blocking.
func (g *gate) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return // the batch processor would ignore it too
	}
	if g.pending.Add(1) > g.limit {
		g.pending.Add(-1)
		g.queueFull.Inc()
		return
	}
	g.SpanProcessor.OnEnd(s)
}

// countingExporter frees the gate's room for each batch sent, and counts
// the spans of a batch the exporter gave up on (after its own retries).
type countingExporter struct {
	sdktrace.SpanExporter
	gate   *gate
	failed prometheus.Counter
}

// ExportSpans sends spans and accounts for them.
func (c *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := c.SpanExporter.ExportSpans(ctx, spans)
	c.gate.pending.Add(-int64(len(spans)))
	if err != nil {
		c.failed.Add(float64(len(spans)))
	}
	return err
}

// Shutdown flushes what the queues hold, within ctx, and stops the
// exporters.
func (p *Provider) Shutdown(ctx context.Context) error {
	if err := p.TracerProvider.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("flush traces: %w", err)
	}
	return nil
}
