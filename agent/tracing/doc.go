// Package tracing sets up OpenTelemetry tracing from the standard OTEL_*
// environment variables and carries W3C trace context to and from the
// strings the spool stores with a job. It sets no global: main passes the
// provider down as a trace.TracerProvider value.
package tracing
