package oci

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// liveness bounds the waits of these tests for something that happens at
// once when the code is right; it is not a speed measurement.
const liveness = 10 * time.Second

// holdHalf serves blob d's first half at once, then waits for release (or
// the client going away) before sending the rest; every other request goes
// to h. sent closes when the first half was flushed.
type holdHalf struct {
	d       v1.Hash
	sent    chan struct{}
	release chan struct{}
	once    sync.Once
	freed   sync.Once
}

// free lets the held rest go; later calls do nothing.
func (hh *holdHalf) free() { hh.freed.Do(func() { close(hh.release) }) }

func newHoldHalf(d v1.Hash) *holdHalf {
	return &holdHalf{d: d, sent: make(chan struct{}), release: make(chan struct{})}
}

func (hh *holdHalf) wrap(next http.Handler) http.Handler {
	return blobWrapper([]v1.Hash{hh.d}, func(w http.ResponseWriter, r *http.Request, h http.Handler) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(rec.Code)
		w.Write(body[:len(body)/2])
		w.(http.Flusher).Flush()
		hh.once.Do(func() { close(hh.sent) })
		select {
		case <-hh.release:
		case <-r.Context().Done():
			return
		}
		w.Write(body[len(body)/2:])
	})(next)
}

// startLayers resolves ref and starts its downloads; the Layers close when
// the test ends.
func startLayers(t *testing.T, p *Puller, ref string) (*Image, *Layers) {
	t.Helper()
	resolved, err := p.Resolve(context.Background(), Source{Ref: ref})
	if err != nil {
		t.Fatal(err)
	}
	ls, err := p.Start(context.Background(), resolved, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ls.Close() })
	return resolved, ls
}

// readLayer opens layer i and reads it to its end.
func readLayer(t *testing.T, ls *Layers, i int) ([]byte, error) {
	t.Helper()
	rc, err := ls.Open(i)
	if err != nil {
		t.Fatalf("Open(%d): %v", i, err)
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// fetchErr resolves ref and fetches its layers, returning Fetch's error.
func fetchErr(t *testing.T, p *Puller, ref string) error {
	t.Helper()
	resolved, err := p.Resolve(context.Background(), Source{Ref: ref})
	if err != nil {
		t.Fatal(err)
	}
	ls, err := p.Fetch(context.Background(), resolved, nil)
	if err == nil {
		ls.Close()
	}
	return err
}

// readWithin reads exactly len(buf) bytes from r, failing the test when
// they do not come within the liveness bound.
func readWithin(t *testing.T, r io.Reader, buf []byte, what string) {
	t.Helper()
	done := make(chan error, 1)
	go func() { _, err := io.ReadFull(r, buf); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(liveness):
		t.Fatalf("%s: not read within %s", what, liveness)
	}
}

// TestStreamWhileDownloading opens a layer whose download is held half way:
// its first half reads at once, and the rest follows the release.
func TestStreamWhileDownloading(t *testing.T) {
	img := testImage(t, 2, 256<<10)
	want := compressedLayers(t, img)
	hold := newHoldHalf(layerDigests(t, img)[0])
	reg := newTestRegistry(t, hold.wrap)
	t.Cleanup(hold.free) // before the server closes
	push(t, reg.host+"/app:v1", img)
	p := newTestPuller(t, Options{})
	resolved, ls := startLayers(t, p, reg.host+"/app:v1")
	<-hold.sent
	opened := make(chan io.ReadCloser, 1)
	go func() {
		rc, err := ls.Open(0)
		if err != nil {
			t.Errorf("Open(0): %v", err)
		}
		opened <- rc
	}()
	var rc io.ReadCloser
	select {
	case rc = <-opened:
	case <-time.After(liveness):
		t.Fatalf("Open(0) waited for the whole download")
	}
	if rc == nil {
		t.FailNow()
	}
	defer rc.Close()
	half := make([]byte, len(want[0])/2)
	readWithin(t, rc, half, "first half while the download is held")
	if !bytes.Equal(half, want[0][:len(half)]) {
		t.Fatal("the first half read differs from the pushed blob")
	}
	hold.free()
	rest, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read the rest: %v", err)
	}
	if got := append(half, rest...); !bytes.Equal(got, want[0]) {
		t.Fatalf("streamed layer: %d bytes differing from the %d pushed", len(got), len(want[0]))
	}
	if err := ls.Wait(); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	checkLayers(t, ls, resolved, want)
}

// TestStreamDigestMismatch serves a layer with one byte changed: a reader
// following the download gets every byte and then the mismatch instead of
// the end, and the blob never enters the cache.
func TestStreamDigestMismatch(t *testing.T) {
	img := testImage(t, 1, 256<<10)
	d := layerDigests(t, img)[0]
	reg := newTestRegistry(t, blobWrapper([]v1.Hash{d}, func(w http.ResponseWriter, r *http.Request, h http.Handler) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		body[len(body)-10] ^= 0xff
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(rec.Code)
		w.Write(body[:len(body)/2])
		w.(http.Flusher).Flush()
		time.Sleep(50 * time.Millisecond) // the reader starts mid-blob
		w.Write(body[len(body)/2:])
	}))
	push(t, reg.host+"/app:v1", img)
	dir := t.TempDir()
	wantMismatchFollowed(t, newTestPuller(t, Options{CacheDir: dir}), reg.host+"/app:v1", dir)
}

// wantMismatchFollowed starts the fetch of ref, whose first layer is served
// wrong, and checks that a reader following that layer gets the mismatch
// instead of its end, that Wait returns it, and that the cache in dir
// keeps nothing.
func wantMismatchFollowed(t *testing.T, p *Puller, ref, dir string) {
	t.Helper()
	_, ls := startLayers(t, p, ref)
	got, err := readLayer(t, ls, 0)
	if !errors.Is(err, ErrIncomplete) || !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("reading the layer: %d bytes, error %v; want ErrIncomplete and ErrDigestMismatch", len(got), err)
	}
	if werr := ls.Wait(); !errors.Is(werr, ErrDigestMismatch) {
		t.Fatalf("Wait: %v, want ErrDigestMismatch", werr)
	}
	ls.Close()
	blobs, temps := cacheFiles(t, dir)
	if len(blobs) != 0 || len(temps) != 0 {
		t.Errorf("cache holds blobs %v and temp files %v after a mismatch", blobs, temps)
	}
}

// TestDownloadOrder holds the bottom layer's download half way, with one
// connection allowed: the layers above it connect (their GETs arrive) but
// bring no byte until it is complete, so the layer applied first has the
// link to itself.
func TestDownloadOrder(t *testing.T) {
	img := testImage(t, 3, 256<<10)
	ds := layerDigests(t, img)
	hold := newHoldHalf(ds[0])
	reg := newTestRegistry(t, hold.wrap)
	t.Cleanup(hold.free)
	push(t, reg.host+"/app:v1", img)
	dir := t.TempDir()
	p := newTestPuller(t, Options{CacheDir: dir, DownloadConnections: 1})
	resolved, ls := startLayers(t, p, reg.host+"/app:v1")
	<-hold.sent
	deadline := time.Now().Add(liveness)
	for reg.blobGets(ds[1]) == 0 || reg.blobGets(ds[2]) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the upper layers were not requested while the bottom one downloads (GETs %d, %d)",
				reg.blobGets(ds[1]), reg.blobGets(ds[2]))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Their answers are at hand: give them time to be read, were they allowed.
	time.Sleep(300 * time.Millisecond)
	blobs, temps := cacheFiles(t, dir)
	if len(blobs) != 0 {
		t.Errorf("blobs %v complete while the bottom layer still downloads", blobs)
	}
	for _, tmp := range temps {
		fi, err := os.Stat(filepath.Join(dir, "blobs", "sha256", tmp))
		if err == nil && fi.Size() > 0 && !strings.Contains(tmp, ds[0].Hex) {
			t.Errorf("temp blob %s has %d bytes while the bottom layer still downloads", tmp, fi.Size())
		}
	}
	hold.free()
	if err := ls.Wait(); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	checkLayers(t, ls, resolved, compressedLayers(t, img))
}

// cutOnce drops the connection of the first GET of blob d after cut body
// bytes; with ranges false it also strips Range from the requests, as a
// registry serving only whole blobs would. ranged counts the Range
// requests that reached the registry.
type cutOnce struct {
	d      v1.Hash
	cut    int
	ranges bool
	// refuse answers Range requests 416, as a registry refusing ranges.
	refuse bool

	mu     sync.Mutex
	cuts   int
	ranged int
}

func (c *cutOnce) wrap(next http.Handler) http.Handler {
	return blobWrapper([]v1.Hash{c.d}, func(w http.ResponseWriter, r *http.Request, h http.Handler) {
		if !c.ranges {
			r.Header.Del("Range")
		}
		c.mu.Lock()
		if r.Header.Get("Range") != "" {
			c.ranged++
		}
		first := c.cuts == 0
		c.cuts++
		c.mu.Unlock()
		if c.refuse && r.Header.Get("Range") != "" {
			http.Error(w, "range refused", http.StatusRequestedRangeNotSatisfiable)
			return
		}
		if !first {
			h.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(rec.Code)
		w.Write(body[:c.cut])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // the connection drops mid-body
	})(next)
}

// TestResumeDroppedDownload drops a layer download mid-blob: a registry
// serving ranges is asked for the rest only; one ignoring Range sends the
// whole blob again and the bytes already received are skipped, as does one
// refusing the range (416) after it is asked again without. Either way
// a reader following the download sees one unbroken, correct stream.
func TestResumeDroppedDownload(t *testing.T) {
	for _, tc := range []struct {
		name           string
		ranges, refuse bool
		gets, ranged   int
	}{
		{name: "Range", ranges: true, gets: 2, ranged: 1},
		{name: "NoRange", gets: 2},
		{name: "RangeRefused", ranges: true, refuse: true, gets: 3, ranged: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img := testImage(t, 1, 512<<10)
			want := compressedLayers(t, img)
			d := layerDigests(t, img)[0]
			cut := &cutOnce{d: d, cut: len(want[0]) / 3, ranges: tc.ranges, refuse: tc.refuse}
			reg := newTestRegistry(t, cut.wrap)
			push(t, reg.host+"/app:v1", img)
			p := newTestPuller(t, Options{})
			_, ls := startLayers(t, p, reg.host+"/app:v1")
			got, err := readLayer(t, ls, 0)
			if err != nil || !bytes.Equal(got, want[0]) {
				t.Fatalf("streamed layer: %d bytes (want %d), equal %v, error %v", len(got), len(want[0]), bytes.Equal(got, want[0]), err)
			}
			if err := ls.Wait(); err != nil {
				t.Fatalf("Wait: %v", err)
			}
			cut.mu.Lock()
			defer cut.mu.Unlock()
			if cut.cuts != tc.gets {
				t.Errorf("%d GETs of the layer, want %d", cut.cuts, tc.gets)
			}
			if cut.ranged != tc.ranged {
				t.Errorf("%d Range requests reached the registry, want %d", cut.ranged, tc.ranged)
			}
		})
	}
}

// TestResumesBounded drops every answer for a layer after a few bytes: the
// download continues a bounded number of times, then fails with the cause.
func TestResumesBounded(t *testing.T) {
	img := testImage(t, 1, 256<<10)
	d := layerDigests(t, img)[0]
	var mu sync.Mutex
	gets := 0
	reg := newTestRegistry(t, blobWrapper([]v1.Hash{d}, func(w http.ResponseWriter, r *http.Request, h http.Handler) {
		mu.Lock()
		gets++
		mu.Unlock()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		w.Header().Set("Content-Length", rec.Header().Get("Content-Length"))
		if cr := rec.Header().Get("Content-Range"); cr != "" {
			w.Header().Set("Content-Range", cr)
		}
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes()[:1000])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}))
	push(t, reg.host+"/app:v1", img)
	dir := t.TempDir()
	p := newTestPuller(t, Options{CacheDir: dir})
	err := fetchErr(t, p, reg.host+"/app:v1")
	if err == nil {
		t.Fatal("Fetch succeeded although every answer is cut")
	}
	t.Logf("Fetch: %v", err)
	mu.Lock()
	defer mu.Unlock()
	if limit := 1 + maxResumes + attemptsPerPlace; gets > limit {
		t.Errorf("%d GETs of the layer, want at most %d", gets, limit)
	}
	if gets <= maxResumes {
		t.Errorf("%d GETs of the layer: the download gave up before %d resumes", gets, maxResumes)
	}
	blobs, temps := cacheFiles(t, dir)
	if len(blobs) != 0 || len(temps) != 0 {
		t.Errorf("cache holds blobs %v and temp files %v after the failure", blobs, temps)
	}
}

// TestStreamStall follows a layer whose registry stops sending after a few
// bytes: the stall watchdog ends the download (after its one retry) and
// the reader waiting for the rest gets the stall instead of hanging.
func TestStreamStall(t *testing.T) {
	img := testImage(t, 1, 4096)
	d := layerDigests(t, img)[0]
	reg := newTestRegistry(t, blobWrapper([]v1.Hash{d}, func(w http.ResponseWriter, r *http.Request, h http.Handler) {
		trickle(h, 16, 300*time.Millisecond, 0)(w, r)
	}))
	push(t, reg.host+"/app:v1", img)
	p := newTestPuller(t, Options{StallTimeout: 100 * time.Millisecond})
	_, ls := startLayers(t, p, reg.host+"/app:v1")
	rc, err := ls.Open(0)
	if err != nil {
		t.Fatalf("Open(0): %v", err)
	}
	defer rc.Close()
	got, err := io.ReadAll(rc)
	if !errors.Is(err, ErrIncomplete) || !errors.Is(err, ErrStalled) {
		t.Fatalf("reading the stalled layer: %d bytes, error %v; want ErrIncomplete and ErrStalled", len(got), err)
	}
	if n := reg.blobGets(d); n != 2 {
		t.Errorf("the stalled layer was requested %d times, want 2 (one retry, from the bytes received)", n)
	}
}

// TestCached tells an image whose layers would download from one the
// cache holds.
func TestCached(t *testing.T) {
	reg := newTestRegistry(t, nil)
	img := testImage(t, 2, 4096)
	push(t, reg.host+"/app:v1", img)
	p := newTestPuller(t, Options{})
	resolved, err := p.Resolve(context.Background(), Source{Ref: reg.host + "/app:v1"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Cached(resolved) {
		t.Fatal("Cached before any fetch")
	}
	if err := fetchErr(t, p, reg.host+"/app:v1"); err != nil {
		t.Fatal(err)
	}
	if !p.Cached(resolved) {
		t.Fatal("not Cached after the fetch")
	}
}
