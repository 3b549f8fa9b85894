package oci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestChunkedFetch fetches a layer behind a per-connection cap: the fetch
// adds streams, which ask for ranges of the blob on several connections,
// never more than LayerConnections at once; the bytes and the digest are
// right, and the fetch span has a bounded number of chunk events.
func TestChunkedFetch(t *testing.T) {
	img := testImage(t, 1, 4<<20)
	want := compressedLayers(t, img)
	d := layerDigests(t, img)[0]
	link := newLinkModel(8<<20, 0, 0)
	reg := newTestRegistry(t, link.wrap)
	push(t, reg.host+"/app:v1", img)
	p := newChunkingPuller(t, Options{LayerConnections: 3})

	began := time.Now()
	spans := tracedFetch(t, p, reg.host+"/app:v1", want)
	took := time.Since(began)

	reqs := link.requests(d)
	conns := link.connections(d)
	t.Logf("%d requests on %d connections in %s: %+v", len(reqs), conns, took, reqs)
	if conns < 2 {
		t.Errorf("the layer came over %d connection(s), want several", conns)
	}
	if reqs[0].rng != "" {
		t.Errorf("the first request asked for %q, want the whole blob", reqs[0].rng)
	}
	ranged := 0
	for _, q := range reqs[1:] {
		if q.rng != "" {
			ranged++
		}
	}
	if ranged == 0 {
		t.Error("no Range request")
	}
	var chunks, maxConn int64 = 0, -1
	for _, s := range spans {
		if s.Name() != SpanLayerFetch {
			continue
		}
		for _, e := range s.Events() {
			if e.Name != EventLayerChunk {
				continue
			}
			chunks++
			for _, a := range e.Attributes {
				if a.Key == "oci.layer.connection" {
					maxConn = max(maxConn, a.Value.AsInt64())
				}
			}
		}
		if len(s.Events()) > maxLayerEvents {
			t.Errorf("%d events on the fetch span, want at most %d", len(s.Events()), maxLayerEvents)
		}
		for _, a := range s.Attributes() {
			if a.Key == "oci.layer.connections" && (a.Value.AsInt64() < 2 || a.Value.AsInt64() > 3) {
				t.Errorf("span attribute oci.layer.connections = %d, want 2 or 3 (LayerConnections)", a.Value.AsInt64())
			}
		}
	}
	if chunks < 2 || maxConn < 1 {
		t.Errorf("%d chunk events, highest connection index %d; want several chunks over several connections", chunks, maxConn)
	}
}

// chunkedRegistry is a registry behind a link capping each connection at
// 8 MB/s, serving img; tamper (may be nil) changes answers.
func chunkedRegistry(t *testing.T, img v1.Image, tamper func(q blobReq, k int, a *answer)) (*testRegistry, *linkModel) {
	t.Helper()
	link := newLinkModel(8<<20, 0, 0)
	link.tamper = tamper
	reg := newTestRegistry(t, link.wrap)
	push(t, reg.host+"/app:v1", img)
	return reg, link
}

// rangeRefusal answers Range requests for blob with the whole blob, as a
// registry ignoring Range does, or with 416 (refuse).
func rangeRefusal(blob []byte, refuse bool) func(q blobReq, k int, a *answer) {
	return func(q blobReq, _ int, a *answer) {
		if q.rng == "" || a.status != http.StatusPartialContent {
			return
		}
		a.header.Del("Content-Range")
		if refuse {
			a.status, a.body = http.StatusRequestedRangeNotSatisfiable, []byte("range refused")
			return
		}
		a.status, a.body = http.StatusOK, blob
	}
}

// continued reports whether a request of reqs asked for the rest of the
// range rng from a byte past its first on.
func continued(reqs []blobReq, rng string) bool {
	var first, last int64
	if _, err := fmt.Sscanf(rng, "bytes=%d-%d", &first, &last); err != nil {
		return false
	}
	for _, q := range reqs {
		var a, b int64
		if _, err := fmt.Sscanf(q.rng, "bytes=%d-%d", &a, &b); err == nil && a > first && a <= last && b == last {
			return true
		}
	}
	return false
}

// TestChunkedNoRanges fetches from registries that ignore Range (200 with
// the whole blob) or refuse it (416): the first Range answer ends the
// extra streams, the first stream reads the whole blob once, and the
// bytes are right.
func TestChunkedNoRanges(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		t.Run(fmt.Sprintf("refuse=%v", refuse), func(t *testing.T) {
			img := testImage(t, 1, 3<<20)
			d := layerDigests(t, img)[0]
			reg, link := chunkedRegistry(t, img, rangeRefusal(compressedLayers(t, img)[0], refuse))
			p := newChunkingPuller(t, Options{})
			fetchAll(t, p, Source{Ref: reg.host + "/app:v1"}, compressedLayers(t, img))
			reqs := link.requests(d)
			t.Logf("%d requests: %+v", len(reqs), reqs)
			if reqs[0].rng != "" {
				t.Errorf("first request asked for %q, want the whole blob", reqs[0].rng)
			}
			// Streams granted before the first verdict may each have
			// asked once; none after.
			if len(reqs) > DefaultLayerConnections {
				t.Errorf("%d requests for the layer, want at most %d", len(reqs), DefaultLayerConnections)
			}
			for _, q := range reqs[1:] {
				if q.rng == "" {
					t.Errorf("the whole blob was asked for again: %+v", reqs)
				}
			}
		})
	}
}

// TestChunkResumed cuts an extra stream's chunk half way: the stream asks
// for the rest of that chunk only, and the blob is right.
func TestChunkResumed(t *testing.T) {
	var cut atomic.Value // the range cut
	cut.Store("")
	img := testImage(t, 1, 3<<20)
	reg, link := chunkedRegistry(t, img, func(q blobReq, _ int, a *answer) {
		if q.offset() > 0 && cut.CompareAndSwap("", q.rng) {
			a.cutAfter = len(a.body) / 2
		}
	})
	d := layerDigests(t, img)[0]
	p := newChunkingPuller(t, Options{})
	fetchAll(t, p, Source{Ref: reg.host + "/app:v1"}, compressedLayers(t, img))
	rng := cut.Load().(string)
	if rng == "" {
		t.Fatal("no chunk was cut")
	}
	if !continued(link.requests(d), rng) {
		t.Errorf("the cut chunk %s was not continued from where it stopped: %+v", rng, link.requests(d))
	}
}

// TestChunkDigestMismatch changes a byte in a chunk: the fetch fails with
// a digest mismatch at the end, the reader following the layer gets it
// instead of the end, and nothing enters the cache.
func TestChunkDigestMismatch(t *testing.T) {
	var once sync.Once
	reg, _ := chunkedRegistry(t, testImage(t, 1, 3<<20), func(q blobReq, _ int, a *answer) {
		if q.offset() > 0 && a.status == http.StatusPartialContent {
			once.Do(func() { a.body = bytes.Clone(a.body); a.body[len(a.body)/2] ^= 0xff })
		}
	})
	dir := t.TempDir()
	wantMismatchFollowed(t, newChunkingPuller(t, Options{CacheDir: dir}), reg.host+"/app:v1", dir)
}

// TestChunksFollowRedirectOnce serves the blob from an object store the
// registry redirects to with a signed URL: the registry sees one GET of
// the blob, the chunks all go to the store. A signature that expires
// mid-download sends one request back to the registry for a new one.
func TestChunksFollowRedirectOnce(t *testing.T) {
	for _, expire := range []bool{false, true} {
		t.Run(fmt.Sprintf("expire=%v", expire), func(t *testing.T) {
			img := testImage(t, 1, 3<<20)
			d := layerDigests(t, img)[0]
			link := newLinkModel(8<<20, 0, 0)
			var mu sync.Mutex
			sig, redirects, storeGETs, expired := 0, 0, 0, 0
			reg := newTestRegistry(t, func(h http.Handler) http.Handler {
				store := link.wrap(h)
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					switch {
					case r.Method == http.MethodGet && r.URL.Path == "/store/"+d.String():
						mu.Lock()
						storeGETs++
						valid := r.URL.Query().Get("X-Amz-Signature") == fmt.Sprint(sig)
						if expire && storeGETs == 3 {
							sig++ // the signature given out expires now
							valid = false
						}
						if !valid {
							expired++
						}
						mu.Unlock()
						if !valid {
							http.Error(w, "<Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>", http.StatusForbidden)
							return
						}
						r.URL.Path = "/v2/app/blobs/" + d.String()
						store.ServeHTTP(w, r)
					case r.Method == http.MethodGet && r.URL.Path == "/v2/app/blobs/"+d.String():
						mu.Lock()
						redirects++
						u := fmt.Sprintf("/store/%s?X-Amz-Expires=60&X-Amz-Signature=%d", d, sig)
						mu.Unlock()
						http.Redirect(w, r, u, http.StatusTemporaryRedirect)
					default:
						h.ServeHTTP(w, r)
					}
				})
			})
			push(t, reg.host+"/app:v1", img)
			reg.reset()
			p := newChunkingPuller(t, Options{})
			fetchAll(t, p, Source{Ref: reg.host + "/app:v1"}, compressedLayers(t, img))
			mu.Lock()
			defer mu.Unlock()
			t.Logf("%d redirects, %d store GETs (%d refused), requests at the store: %+v", redirects, storeGETs, expired, link.requests(d))
			wantRedirects := 1
			if expire {
				wantRedirects = 2
			}
			if redirects != wantRedirects {
				t.Errorf("the registry redirected %d times, want %d", redirects, wantRedirects)
			}
			if storeGETs < 3 || link.connections(d) < 2 {
				t.Errorf("%d GETs at the store on %d connections, want chunks over several", storeGETs, link.connections(d))
			}
		})
	}
}

// oursRunning lists the goroutines running the fetch machinery.
func oursRunning() []string {
	var out []string
	for _, g := range goroutines() {
		if strings.Contains(g, "oci.(*blobRun)") || strings.Contains(g, "oci.(*streamGate)") {
			out = append(out, g)
		}
	}
	return out
}

// TestChunkedCancel cancels a fetch while several chunk connections are
// held mid-body: Fetch returns at once with the cancellation, every
// stream's goroutine ends, and the partial file is gone.
func TestChunkedCancel(t *testing.T) {
	img := testImage(t, 1, 3<<20)
	reg, link := chunkedRegistry(t, img, func(q blobReq, _ int, a *answer) { a.stallAfter = 64 << 10 })
	d := layerDigests(t, img)[0]
	dir := t.TempDir()
	p := newChunkingPuller(t, Options{CacheDir: dir})
	// The held bodies bring nothing: start with several streams, as the
	// rule would have added them on a moving link.
	p.firstStreams = 3
	resolved, err := p.Resolve(context.Background(), Source{Ref: reg.host + "/app:v1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := p.Fetch(ctx, resolved, nil)
		done <- err
	}()
	deadline := time.Now().Add(liveness)
	for link.connections(d) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d connections held: %+v", link.connections(d), link.requests(d))
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case err = <-done:
	case <-time.After(liveness):
		t.Fatal("Fetch did not return after the cancellation")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Fetch error = %v, want context.Canceled", err)
	}
	for left := oursRunning(); len(left) > 0; left = oursRunning() {
		if time.Now().After(deadline) {
			t.Fatalf("%d fetch goroutines still run after Fetch returned:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(5 * time.Millisecond)
	}
	blobs, temps := cacheFiles(t, dir)
	if len(blobs) != 0 || len(temps) != 0 {
		t.Errorf("cache holds blobs %v and temp files %v after cancellation", blobs, temps)
	}
}

// TestChunkHostile: a registry lying in Content-Range, or sending more
// than a chunk asked for, fails the fetch with nothing kept; one chunk's
// connection stalling is dropped and the chunk asked for again.
func TestChunkHostile(t *testing.T) {
	var tampered atomic.Value // the range of the answer changed
	first := func(f func(a *answer)) func(q blobReq, k int, a *answer) {
		tampered.Store("")
		return func(q blobReq, _ int, a *answer) {
			if q.offset() > 0 && a.status == http.StatusPartialContent && tampered.CompareAndSwap("", q.rng) {
				f(a)
			}
		}
	}
	for _, tc := range []struct {
		name   string
		tamper func(a *answer)
		want   string // in the error; "" for a fetch that succeeds
	}{
		{"ContentRangeLie", func(a *answer) {
			var first, last, size int64
			fmt.Sscanf(a.header.Get("Content-Range"), "bytes %d-%d/%d", &first, &last, &size)
			a.header.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", first+1, last, size))
		}, "the registry answered with Content-Range"},
		{"LongerThanAsked", func(a *answer) {
			a.body = append(bytes.Clone(a.body), "more bytes"...)
			a.noLength = true
		}, "more bytes than the range asked for"},
		{"LengthAnnounced", func(a *answer) {
			a.body = append(bytes.Clone(a.body), "more bytes"...)
		}, "the registry announced a body of"},
		{"Stall", func(a *answer) { a.stallAfter = 1000 }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img := testImage(t, 1, 3<<20)
			reg, link := chunkedRegistry(t, img, first(tc.tamper))
			dir := t.TempDir()
			p := newChunkingPuller(t, Options{CacheDir: dir, StallTimeout: 200 * time.Millisecond})
			if tc.want == "" {
				fetchAll(t, p, Source{Ref: reg.host + "/app:v1"}, compressedLayers(t, img))
				d := layerDigests(t, img)[0]
				if rng := tampered.Load().(string); rng == "" || !continued(link.requests(d), rng) {
					t.Errorf("the stalled chunk %q was not asked for again: %+v", rng, link.requests(d))
				}
				return
			}
			err := fetchErr(t, p, reg.host+"/app:v1")
			t.Logf("Fetch: %v", err)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Fetch error = %v, want one saying %q", err, tc.want)
			}
			blobs, temps := cacheFiles(t, dir)
			if len(blobs) != 0 || len(temps) != 0 {
				t.Errorf("cache holds blobs %v and temp files %v after the failure", blobs, temps)
			}
		})
	}
}

// TestSpareStreamsTakeNextLayer: with one stream allowed per layer, the
// streams the rule adds start the next layer while the first one still
// downloads; with one connection in all, a layer starts only once the
// one below it is written.
func TestSpareStreamsTakeNextLayer(t *testing.T) {
	for _, conns := range []int{1, 4} {
		t.Run(fmt.Sprintf("connections=%d", conns), func(t *testing.T) {
			img := testImage(t, 2, 2<<20)
			reg, _ := chunkedRegistry(t, img, nil)
			p := newChunkingPuller(t, Options{DownloadConnections: conns, LayerConnections: 1})
			spans := tracedFetch(t, p, reg.host+"/app:v1", compressedLayers(t, img))
			// When layer 0's last chunk was written, and layer 1's
			// first stream granted.
			var written0, turn1 time.Time
			for _, s := range spans {
				idx := -1
				for _, a := range s.Attributes() {
					if a.Key == "oci.layer.index" {
						idx = int(a.Value.AsInt64())
					}
				}
				for _, e := range s.Events() {
					switch {
					case idx == 0 && e.Name == EventLayerChunk && e.Time.After(written0):
						written0 = e.Time
					case idx == 1 && e.Name == EventLayerTurn:
						turn1 = e.Time
					}
				}
			}
			if written0.IsZero() || turn1.IsZero() {
				t.Fatalf("no chunk of layer 0 or no turn of layer 1 (%v, %v)", written0, turn1)
			}
			overlap := turn1.Before(written0)
			t.Logf("layer 1 started %s before layer 0 was written", written0.Sub(turn1))
			if overlap != (conns > 1) {
				t.Errorf("layer 1 started before layer 0 was written: %v, want %v", overlap, conns > 1)
			}
		})
	}
}

// TestChunkedResumeServedWhole drops the first stream's connection early;
// its resume, asked from there to the end, is answered with the whole blob
// while other streams fetch chunks: it skips the bytes held or claimed,
// writes the others, and the blob is right.
func TestChunkedResumeServedWhole(t *testing.T) {
	img := testImage(t, 1, 3<<20)
	blob := compressedLayers(t, img)[0]
	size := len(blob)
	var whole atomic.Int32
	reg, link := chunkedRegistry(t, img, func(q blobReq, k int, a *answer) {
		switch {
		case k == 0:
			a.cutAfter = 100 << 10
		case strings.HasSuffix(q.rng, fmt.Sprintf("-%d", size-1)) && q.offset() > 0 && whole.Add(1) == 1:
			a.status, a.body = http.StatusOK, blob
			a.header.Del("Content-Range")
		}
	})
	p := newChunkingPuller(t, Options{})
	p.firstStreams = 3 // the other streams start at once, before the drop
	fetchAll(t, p, Source{Ref: reg.host + "/app:v1"}, [][]byte{blob})
	reqs := link.requests(layerDigests(t, img)[0])
	t.Logf("requests: %+v", reqs)
	if whole.Load() == 0 {
		t.Fatal("the first stream's resume was never asked for")
	}
	chunks := 0
	for _, q := range reqs {
		if q.rng != "" && !strings.HasSuffix(q.rng, fmt.Sprintf("-%d", size-1)) {
			chunks++
		}
	}
	if chunks == 0 {
		t.Error("no other stream fetched a chunk")
	}
}

// TestStreamsFollowTheBuild: Start adds streams only once the build
// reading a layer waits for its bytes. A build that reads the layer as it
// arrives over a capped link gets several connections; one that reads
// only after the download ended (a registry faster than the build) gets
// the one it started with.
func TestStreamsFollowTheBuild(t *testing.T) {
	for _, tc := range []struct {
		name      string
		following bool
	}{{"BuildWaits", true}, {"BuildBehind", false}} {
		t.Run(tc.name, func(t *testing.T) {
			img := testImage(t, 1, 4<<20)
			want := compressedLayers(t, img)
			d := layerDigests(t, img)[0]
			reg, link := chunkedRegistry(t, img, nil)
			p := newChunkingPuller(t, Options{LayerConnections: 3})
			ctx := context.Background()
			resolved, err := p.Resolve(ctx, Source{Ref: reg.host + "/app:v1"})
			if err != nil {
				t.Fatal(err)
			}
			ls, err := p.Start(ctx, resolved, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer ls.Close()
			if !tc.following {
				if err := ls.Wait(); err != nil {
					t.Fatal(err)
				}
			}
			checkLayers(t, ls, resolved, want)
			conns := link.connections(d)
			switch {
			case tc.following && conns < 2:
				t.Errorf("a build waiting for the layer got %d connection(s), want several", conns)
			case !tc.following && conns != 1:
				t.Errorf("a build that never waited got %d connections, want 1", conns)
			}
		})
	}
}

// TestLayerBelowTakesStreamsFirst: when the rule raises the streams by
// several at once, they go to the bottom layer up to its cap before the
// next layer gets one, so the layer a build applies first gets the link
// first. (Its helpers used to queue one at a time, and the next layer took
// the grants meant for the rest.)
func TestLayerBelowTakesStreamsFirst(t *testing.T) {
	img := testImage(t, 2, 6<<20)
	reg, _ := chunkedRegistry(t, img, nil)
	p := newChunkingPuller(t, Options{DownloadConnections: 4, LayerConnections: 4})
	conns := map[int64]int64{}
	for _, s := range tracedFetch(t, p, reg.host+"/app:v1", compressedLayers(t, img)) {
		idx, n := int64(-1), int64(0)
		for _, a := range s.Attributes() {
			switch a.Key {
			case "oci.layer.index":
				idx = a.Value.AsInt64()
			case "oci.layer.connections":
				n = a.Value.AsInt64()
			}
		}
		if idx >= 0 && n > 0 {
			conns[idx] = n
		}
	}
	if conns[0] != 4 {
		t.Errorf("the bottom layer ran %d streams at most (layers: %v), want 4, its cap", conns[0], conns)
	}
}

// tracedFetch fetches ref with p under a recorded "build" span, checks
// the layers against want, and returns the spans that ended.
func tracedFetch(t *testing.T, p *Puller, ref string, want [][]byte) []sdktrace.ReadOnlySpan {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	ctx, root := tp.Tracer("test").Start(context.Background(), "build")
	fetchAllCtx(t, ctx, p, Source{Ref: ref}, want)
	root.End()
	return rec.Ended()
}
