package oci

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestSpansCarryNoSignature: a blob redirected to a signed URL that fails
// leaves the signature neither in the fetch's error nor in any span's
// status, event or attribute the tracer exports.
func TestSpansCarryNoSignature(t *testing.T) {
	const signature = "SIGNATURE-never-exported-0123"
	img := testImage(t, 1, 512)
	layer := layerDigests(t, img)[0]
	var on atomic.Bool
	reg := newTestRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch {
			case r.URL.Path == "/signed/blob":
				// The object store drops the connection before a byte.
				conn, _, err := w.(http.Hijacker).Hijack()
				if err == nil {
					conn.Close()
				}
				return
			case on.Load() && r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+layer.String()):
				http.Redirect(w, r, "/signed/blob?X-Amz-Expires=300&X-Amz-Signature="+signature, http.StatusTemporaryRedirect)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	push(t, reg.host+"/app:v1", img)
	on.Store(true)

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	ctx, root := tp.Tracer("test").Start(context.Background(), "build")
	p := newStrictPuller(t, Options{Insecure: []string{reg.host}})
	resolved, err := p.Resolve(ctx, Source{Ref: reg.host + "/app:v1"})
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	_, err = p.Fetch(ctx, resolved, nil)
	root.End()
	if err == nil {
		t.Fatal("Fetch through a refused redirect succeeded")
	}
	if strings.Contains(err.Error(), signature) {
		t.Errorf("the fetch error carries the signature: %v", err)
	}
	fetched := 0
	for _, s := range rec.Ended() {
		if s.Name() == SpanLayerFetch {
			fetched++
		}
		texts := []string{s.Status().Description}
		for _, a := range s.Attributes() {
			texts = append(texts, a.Value.String())
		}
		for _, e := range s.Events() {
			for _, a := range e.Attributes {
				texts = append(texts, a.Value.String())
			}
		}
		for _, text := range texts {
			if strings.Contains(text, signature) {
				t.Errorf("span %s exports the signature: %s", s.Name(), text)
			}
		}
	}
	if fetched == 0 {
		t.Errorf("no %s span was recorded: the test saw no layer fetch", SpanLayerFetch)
	}
}
