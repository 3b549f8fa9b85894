package oci

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// trickle answers like h, but sends the body's first head bytes at once and
// the rest one byte per every (or the first slow bytes of the rest that way,
// when slow > 0, and then all at once), until the client goes away.
func trickle(h http.Handler, head int, every time.Duration, slow int) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(rec.Code)
		head = min(head, len(body))
		w.Write(body[:head])
		w.(http.Flusher).Flush()
		rest := body[head:]
		for i := range rest {
			if slow > 0 && i >= slow {
				w.Write(rest[i:])
				return
			}
			select {
			case <-r.Context().Done():
				return
			case <-time.After(every):
			}
			if _, err := w.Write(rest[i : i+1]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
	}
}

func wantStall(t *testing.T, err error, msg string) {
	t.Helper()
	if !errors.Is(err, ErrStalled) {
		t.Fatalf("error = %v, want ErrStalled", err)
	}
	if !strings.Contains(err.Error(), msg) {
		t.Errorf("error %q does not contain %q", err, msg)
	}
}

func TestStalledLayer(t *testing.T) {
	img := testImage(t, 2, 2048)
	d := layerDigests(t, img)[1]
	ctx := context.Background()
	for name, serve := range map[string]func(w http.ResponseWriter, r *http.Request, h http.Handler){
		// Headers and a few bytes, then one byte per 300 ms.
		"Body": func(w http.ResponseWriter, r *http.Request, h http.Handler) {
			trickle(h, 16, 300*time.Millisecond, 0)(w, r)
		},
		// No headers at all.
		"Headers": func(w http.ResponseWriter, r *http.Request, h http.Handler) {
			<-r.Context().Done()
		},
	} {
		t.Run(name, func(t *testing.T) {
			reg := newTestRegistry(t, blobWrapper([]v1.Hash{d}, serve))
			push(t, reg.host+"/app:v1", img)
			reg.reset()
			p := newTestPuller(t, Options{StallTimeout: 100 * time.Millisecond})
			resolved, err := p.Resolve(ctx, Source{Ref: reg.host + "/app:v1"})
			if err != nil {
				t.Fatal(err)
			}
			_, err = p.Fetch(ctx, resolved, nil)
			t.Logf("Fetch: %v", err)
			wantStall(t, err, "layer 1: download stalled: no data for 100ms (build.stall_timeout)")
			if n := reg.blobGets(d); n != 2 {
				t.Errorf("the stalled layer was requested %d times, want 2 (one retry)", n)
			}
			if st := p.cache.Stats(); st.Pinned != 0 {
				t.Errorf("%d blobs still pinned after a failed Fetch", st.Pinned)
			}
		})
	}
}

// TestSlowLayerIsNotStalled trickles a layer one byte per 50 ms for longer
// than the stall timeout in all: each byte resets the watchdog.
func TestSlowLayerIsNotStalled(t *testing.T) {
	img := testImage(t, 1, 64)
	d := layerDigests(t, img)[0]
	reg := newTestRegistry(t, blobWrapper([]v1.Hash{d}, func(w http.ResponseWriter, r *http.Request, h http.Handler) {
		trickle(h, 4, 50*time.Millisecond, 30)(w, r) // 30 slow bytes: 1.5 s
	}))
	push(t, reg.host+"/app:v1", img)
	reg.reset()
	p := newTestPuller(t, Options{StallTimeout: time.Second})
	fetchAll(t, p, Source{Ref: reg.host + "/app:v1"}, compressedLayers(t, img))
	if n := reg.blobGets(d); n != 1 {
		t.Errorf("the slow layer was requested %d times, want 1", n)
	}
}

func TestStalledManifest(t *testing.T) {
	img := testImage(t, 1, 256)
	reg := newTestRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/manifests/") {
				trickle(h, 8, 300*time.Millisecond, 0)(w, r)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	push(t, reg.host+"/app:v1", img)
	reg.reset()
	p := newTestPuller(t, Options{StallTimeout: 100 * time.Millisecond})
	_, err := p.Resolve(context.Background(), Source{Ref: reg.host + "/app:v1"})
	wantStall(t, err, "resolve "+reg.host+"/app:v1: download stalled: no data for 100ms (build.stall_timeout)")
	reg.mu.Lock()
	n := reg.manifests
	reg.mu.Unlock()
	if n != 2 {
		t.Errorf("the stalled manifest was requested %d times, want 2 (one retry)", n)
	}
}
