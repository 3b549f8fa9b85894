package oci

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
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
			if name == "Body" { // a few bytes came, then too few
				wantStall(t, err, "layer 1: download stalled: 16 bytes in 100ms, below the 102 that build.min_transfer_rate asks over build.stall_timeout")
			} else {
				wantStall(t, err, "layer 1: download stalled: no data for 100ms (build.stall_timeout)")
			}
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
// than the stall timeout in all: 20 bytes/s is above a MinTransferRate of
// 8, so each window of the stall timeout has brought enough.
func TestSlowLayerIsNotStalled(t *testing.T) {
	img := testImage(t, 1, 64)
	d := layerDigests(t, img)[0]
	reg := newTestRegistry(t, blobWrapper([]v1.Hash{d}, func(w http.ResponseWriter, r *http.Request, h http.Handler) {
		trickle(h, 4, 50*time.Millisecond, 30)(w, r) // 30 slow bytes: 1.5 s
	}))
	push(t, reg.host+"/app:v1", img)
	reg.reset()
	p := newTestPuller(t, Options{StallTimeout: time.Second, MinTransferRate: 8})
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
	wantStall(t, err, "resolve "+reg.host+"/app:v1: download stalled: 8 bytes in 100ms, below the 102 that build.min_transfer_rate asks over build.stall_timeout")
	reg.mu.Lock()
	n := reg.manifests
	reg.mu.Unlock()
	if n != 2 {
		t.Errorf("the stalled manifest was requested %d times, want 2 (one retry)", n)
	}
}

// dribble sends status and header, then one byte of body per every until
// the client goes away, and records that it went away.
func dribble(w http.ResponseWriter, r *http.Request, status int, every time.Duration, gone chan<- struct{}) {
	w.WriteHeader(status)
	w.(http.Flusher).Flush()
	defer func() {
		select {
		case gone <- struct{}{}:
		default:
		}
	}()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-time.After(every):
		}
		if _, err := w.Write([]byte{'{'}); err != nil {
			return
		}
		w.(http.Flusher).Flush()
	}
}

// stallBound is how long a pull from a trickling registry may take with a
// 1 s stall timeout: two attempts of two stall windows each, with room to
// spare on a loaded machine. Without the minimum rate the pulls below run
// until the test's context ends, and fail.
const (
	stallBound    = 12 * time.Second
	trickleWindow = time.Second
)

// TestTricklingRegistry dribbles one byte per 100 ms (far below
// DefaultMinTransferRate, but a byte well within every stall window) on the
// ping, a token answer, the manifest and a layer: each pull returns within
// a few stall windows, failed as stalled (the ping, whose body
// go-containerregistry ignores, is cut and the pull goes on), and the
// registry sees the client go.
func TestTricklingRegistry(t *testing.T) {
	img := testImage(t, 1, 2048)
	d := layerDigests(t, img)[0]
	for _, c := range []struct {
		name string
		// serve answers r when it is the request to dribble.
		serve func(w http.ResponseWriter, r *http.Request, host string, gone chan<- struct{}) bool
		fetch bool
		want  string // in the error; "" for a pull that succeeds
	}{
		{"Ping", func(w http.ResponseWriter, r *http.Request, _ string, gone chan<- struct{}) bool {
			if r.URL.Path != "/v2/" {
				return false
			}
			dribble(w, r, http.StatusOK, 100*time.Millisecond, gone)
			return true
		}, false, ""},
		{"Token", func(w http.ResponseWriter, r *http.Request, host string, gone chan<- struct{}) bool {
			switch {
			case r.URL.Path == "/token":
				dribble(w, r, http.StatusOK, 100*time.Millisecond, gone)
			case r.URL.Path == "/v2/" && r.Header.Get("Authorization") == "":
				w.Header().Set("WWW-Authenticate", `Bearer realm="http://`+host+`/token",service="test"`)
				w.WriteHeader(http.StatusUnauthorized)
			default:
				return false
			}
			return true
		}, false, "download stalled: "},
		{"Manifest", func(w http.ResponseWriter, r *http.Request, _ string, gone chan<- struct{}) bool {
			if !strings.Contains(r.URL.Path, "/manifests/") {
				return false
			}
			dribble(w, r, http.StatusOK, 100*time.Millisecond, gone)
			return true
		}, false, "build.min_transfer_rate asks over build.stall_timeout"},
		{"Layer", func(w http.ResponseWriter, r *http.Request, _ string, gone chan<- struct{}) bool {
			if !strings.HasSuffix(r.URL.Path, "/blobs/"+d.String()) {
				return false
			}
			w.Header().Set("Content-Length", "2048")
			dribble(w, r, http.StatusOK, 100*time.Millisecond, gone)
			return true
		}, true, "layer 0: download stalled: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			gone := make(chan struct{}, 1)
			var host string
			var on atomic.Bool // after the push
			reg := newTestRegistry(t, func(h http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if on.Load() && r.Method == http.MethodGet && c.serve(w, r, host, gone) {
						return
					}
					h.ServeHTTP(w, r)
				})
			})
			host = reg.host
			push(t, reg.host+"/app:v1", img)
			on.Store(true)
			p := newTestPuller(t, Options{StallTimeout: trickleWindow})
			ctx, cancel := context.WithTimeout(context.Background(), 3*stallBound)
			defer cancel()
			began := time.Now()
			resolved, err := p.Resolve(ctx, Source{Ref: reg.host + "/app:v1"})
			if c.fetch {
				if err != nil {
					t.Fatalf("Resolve: %v", err)
				}
				var ls *Layers
				if ls, err = p.Fetch(ctx, resolved, nil); err == nil {
					ls.Close()
				}
			}
			took := time.Since(began)
			t.Logf("after %s: %v", took, err)
			if c.want == "" {
				if err != nil {
					t.Errorf("pull: %v, want success once the ping is cut", err)
				}
			} else {
				wantStall(t, err, c.want)
			}
			if took > stallBound {
				t.Errorf("the pull returned after %s, want within %s", took, stallBound)
			}
			select {
			case <-gone:
			case <-time.After(5 * time.Second):
				t.Errorf("the trickling registry still holds the request")
			}
		})
	}
}

// TestEndlessPingBody answers the ping with a fast body that never ends:
// go-containerregistry drains it, so only a cap lets the pull go on.
func TestEndlessPingBody(t *testing.T) {
	img := testImage(t, 1, 256)
	var sent atomic.Int64
	var on atomic.Bool // after the push
	reg := newTestRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !on.Load() || r.Method != http.MethodGet || r.URL.Path != "/v2/" {
				h.ServeHTTP(w, r)
				return
			}
			chunk := bytes.Repeat([]byte{' '}, 32<<10)
			for r.Context().Err() == nil {
				n, err := w.Write(chunk)
				sent.Add(int64(n))
				if err != nil {
					return
				}
			}
		})
	})
	push(t, reg.host+"/app:v1", img)
	on.Store(true)
	p := newTestPuller(t, Options{StallTimeout: 30 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fetchAllCtx(t, ctx, p, Source{Ref: reg.host + "/app:v1"}, compressedLayers(t, img))
	if n := sent.Load(); n > 64<<20 {
		t.Errorf("the ping body was read for %d MiB, want it cut after a few KiB", n>>20)
	}
}

// TestDocumentDeadline sends a manifest fast enough for the minimum rate
// but without end: a document must be complete within twice the stall
// timeout, whatever its rate.
func TestDocumentDeadline(t *testing.T) {
	img := testImage(t, 1, 256)
	gone := make(chan struct{}, 1)
	var on atomic.Bool // after the push
	reg := newTestRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if on.Load() && r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/manifests/") {
				dribble(w, r, http.StatusOK, 20*time.Millisecond, gone)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	push(t, reg.host+"/app:v1", img)
	on.Store(true)
	p := newTestPuller(t, Options{StallTimeout: trickleWindow, MinTransferRate: 8})
	ctx, cancel := context.WithTimeout(context.Background(), 3*stallBound)
	defer cancel()
	began := time.Now()
	_, err := p.Resolve(ctx, Source{Ref: reg.host + "/app:v1"})
	took := time.Since(began)
	t.Logf("after %s: %v", took, err)
	wantStall(t, err, "was not complete after 2s (twice build.stall_timeout)")
	if took > 2*stallBound {
		t.Errorf("Resolve returned after %s, want within %s", took, 2*stallBound)
	}
}
