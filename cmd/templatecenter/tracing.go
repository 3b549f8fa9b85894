package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/tracing"
)

// traceFlushTimeout bounds the flush of queued spans at exit: a collector
// that does not answer must not hold up a stop.
const traceFlushTimeout = 3 * time.Second

// setupTracing builds the tracer provider the OTEL_* variables describe.
func setupTracing(ctx context.Context, console io.Writer, logger *slog.Logger) (*tracing.Provider, error) {
	tp, err := tracing.Setup(ctx, tracing.Options{Getenv: os.Getenv, Version: Version, Console: console})
	if err != nil {
		return nil, fmt.Errorf("set up tracing (OTEL_* variables): %w", err)
	}
	if ex := tp.Exporters(); len(ex) > 0 {
		logger.Info("exporting traces", "exporters", ex)
	} else {
		logger.Debug("traces are not exported (no OTEL_TRACES_EXPORTER or OTLP endpoint set)")
	}
	return tp, nil
}

// shutdownTracing flushes the spans still queued, within traceFlushTimeout.
func shutdownTracing(tp *tracing.Provider, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), traceFlushTimeout)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		logger.Warn("flush traces at exit", "err", err)
	}
}
