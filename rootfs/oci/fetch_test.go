package oci

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// blobWrapper intercepts GETs of the listed blobs with fn; other requests
// reach the registry.
func blobWrapper(ds []v1.Hash, fn func(w http.ResponseWriter, r *http.Request, h http.Handler)) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet {
				for _, d := range ds {
					if strings.HasSuffix(r.URL.Path, "/blobs/"+d.String()) {
						fn(w, r, h)
						return
					}
				}
			}
			h.ServeHTTP(w, r)
		})
	}
}

func TestFetchThenCacheHit(t *testing.T) {
	reg := newTestRegistry(t, nil)
	base := testImage(t, 2, 4096)
	ls, err := base.Layers()
	if err != nil {
		t.Fatal(err)
	}
	// The first layer appears twice in the manifest.
	img, err := mutate.AppendLayers(base, ls[0])
	if err != nil {
		t.Fatal(err)
	}
	push(t, reg.host+"/app:v1", img)
	want := compressedLayers(t, img)
	p := newTestPuller(t, Options{})
	src := Source{Ref: reg.host + "/app:v1"}

	fetchAll(t, p, src, want)
	for i, d := range layerDigests(t, img)[:2] {
		if n := reg.blobGets(d); n != 1 {
			t.Errorf("layer %d fetched %d times, want 1", i, n)
		}
	}
	bytesUsed, blobs := cacheUsage(p)
	if blobs != 2 || bytesUsed != int64(len(want[0])+len(want[1])) {
		t.Errorf("cache usage = %d bytes, %d blobs; want %d bytes, 2 blobs", bytesUsed, blobs, len(want[0])+len(want[1]))
	}

	reg.reset()
	var last Progress
	resolved, err := p.Resolve(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := p.Fetch(context.Background(), resolved, func(pr Progress) { last = pr })
	if err != nil {
		t.Fatalf("second Fetch: %v", err)
	}
	defer layers.Close()
	checkLayers(t, layers, resolved, want)
	if n := reg.layerGets(t, img); n != 0 {
		t.Errorf("second Fetch made %d layer GETs, want 0", n)
	}
	wantFinal := Progress{TotalBytes: resolved.CompressedSize, DownloadedBytes: resolved.CompressedSize, TotalLayers: 3, CompletedLayers: 3}
	last.SpeedBPS = 0
	if last != wantFinal {
		t.Errorf("final progress = %+v, want %+v", last, wantFinal)
	}
}

func TestConcurrentFetchesShareDownloads(t *testing.T) {
	imgA := testImage(t, 3, 8192)
	imgB := withLayers(t, imgA, 1, 8192)
	shared := layerDigests(t, imgA)
	release := make(chan struct{})
	arrived := make(chan v1.Hash, 16)
	reg := newTestRegistry(t, blobWrapper(shared, func(w http.ResponseWriter, r *http.Request, h http.Handler) {
		arrived <- v1.Hash{Algorithm: "sha256", Hex: r.URL.Path[strings.LastIndex(r.URL.Path, ":")+1:]}
		<-release
		h.ServeHTTP(w, r)
	}))
	push(t, reg.host+"/app:a", imgA)
	push(t, reg.host+"/app:b", imgB)
	reg.reset()

	p := newTestPuller(t, Options{})
	ctx := context.Background()
	a, err := p.Resolve(ctx, Source{Ref: reg.host + "/app:a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Resolve(ctx, Source{Ref: reg.host + "/app:b"})
	if err != nil {
		t.Fatal(err)
	}

	type result struct {
		ls  *Layers
		err error
	}
	resA, resB := make(chan result, 1), make(chan result, 1)
	go func() { ls, err := p.Fetch(ctx, a, nil); resA <- result{ls, err} }()
	// Fetch A now holds a download of every shared blob.
	for range shared {
		<-arrived
	}
	go func() { ls, err := p.Fetch(ctx, b, nil); resB <- result{ls, err} }()
	// Wait until Fetch B waits on each of A's downloads before letting them go.
	deadline := time.Now().Add(30 * time.Second)
	for acquiresWaiting() < len(shared) {
		if time.Now().After(deadline) {
			close(release)
			t.Fatal("Fetch B never waited on Fetch A's downloads")
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(release)

	ra, rb := <-resA, <-resB
	if ra.err != nil || rb.err != nil {
		t.Fatalf("Fetch errors: A %v, B %v", ra.err, rb.err)
	}
	defer ra.ls.Close()
	defer rb.ls.Close()
	checkLayers(t, ra.ls, a, compressedLayers(t, imgA))
	checkLayers(t, rb.ls, b, compressedLayers(t, imgB))
	for i, d := range layerDigests(t, imgB) {
		if n := reg.blobGets(d); n != 1 {
			t.Errorf("layer %d (%s) fetched %d times, want 1", i, d, n)
		}
	}
	select {
	case d := <-arrived:
		t.Errorf("blob %s was requested a second time", d)
	default:
	}
}

// acquiresWaiting counts the goroutines blocked in blobcache's Acquire
// itself, which waits there only for another caller's download of the
// same blob: a leader is blocked further down, in its download.
func acquiresWaiting() int {
	waiting := 0
	for _, g := range goroutines() {
		// A header line, then a function line and a file line per frame,
		// innermost first.
		lines := strings.Split(g, "\n")
		for i := 1; i < len(lines); i += 2 {
			if strings.HasPrefix(lines[i], "runtime.") {
				continue
			}
			if strings.Contains(lines[i], "blobcache.(*Cache).Acquire(") {
				waiting++
			}
			break
		}
	}
	return waiting
}

// goroutines returns the stack of every goroutine.
func goroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

func TestCacheSurvivesRestart(t *testing.T) {
	reg := newTestRegistry(t, nil)
	img := testImage(t, 3, 4096)
	push(t, reg.host+"/app:v1", img)
	want := compressedLayers(t, img)
	dir := t.TempDir()
	src := Source{Ref: reg.host + "/app:v1"}

	p1, err := New(testOptions(dir))
	if err != nil {
		t.Fatal(err)
	}
	fetchAll(t, p1, src, want)
	if _, err := New(testOptions(dir)); !errors.Is(err, ErrCacheLocked) {
		t.Errorf("second New on a locked cache dir: error = %v, want ErrCacheLocked", err)
	}
	if err := p1.Close(); err != nil {
		t.Fatal(err)
	}

	reg.reset()
	p2 := newTestPuller(t, Options{CacheDir: dir})
	if b, n := cacheUsage(p2); n != 3 || b != imageSize(t, img) {
		t.Errorf("cache usage after restart = %d bytes, %d blobs; want %d, 3", b, n, imageSize(t, img))
	}
	fetchAll(t, p2, src, want)
	if n := reg.layerGets(t, img); n != 0 {
		t.Errorf("Fetch after restart made %d layer GETs, want 0", n)
	}
}

func TestNewRemovesStaleTempFiles(t *testing.T) {
	dir := t.TempDir()
	blobs := filepath.Join(dir, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(blobs, tmpPrefix+strings.Repeat("a", 64)+"-123")
	if err := os.WriteFile(stale, []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	newTestPuller(t, Options{CacheDir: dir})
	if exists(t, stale) {
		t.Errorf("New left the stale temp file %s", stale)
	}
}

func TestEvictionSparesPinned(t *testing.T) {
	reg := newTestRegistry(t, nil)
	a := testImage(t, 2, 4096)
	b := testImage(t, 2, 4096)
	push(t, reg.host+"/app:a", a)
	push(t, reg.host+"/app:b", b)
	dir := t.TempDir()
	p := newTestPuller(t, Options{CacheDir: dir, CacheQuotaBytes: imageSize(t, a)})
	ctx := context.Background()
	fetch := func(tag string) *Layers {
		t.Helper()
		img, err := p.Resolve(ctx, Source{Ref: reg.host + "/app:" + tag})
		if err != nil {
			t.Fatal(err)
		}
		ls, err := p.Fetch(ctx, img, nil)
		if err != nil {
			t.Fatal(err)
		}
		return ls
	}
	present := func(img v1.Image, want bool) {
		t.Helper()
		for _, d := range layerDigests(t, img) {
			if got := exists(t, blobPath(dir, d)); got != want {
				t.Errorf("blob %s present = %v, want %v", d, got, want)
			}
		}
	}

	la := fetch("a")
	lb := fetch("b")
	present(a, true) // both pinned: the quota is exceeded, nothing evicted
	present(b, true)
	if used, _ := cacheUsage(p); used != imageSize(t, a)+imageSize(t, b) {
		t.Errorf("cache usage = %d, want %d", used, imageSize(t, a)+imageSize(t, b))
	}
	lb.Close() // b unpinned, a still pinned: b goes
	present(a, true)
	present(b, false)
	la.Close()
	present(a, true) // within quota now
	lb = fetch("b")  // a is unpinned and least recently used
	defer lb.Close()
	present(a, false)
	present(b, true)
	if used, _ := cacheUsage(p); used > imageSize(t, a) && used != imageSize(t, b) {
		t.Errorf("cache usage = %d, want %d", used, imageSize(t, b))
	}
}

func TestEvictionOrderSurvivesRestart(t *testing.T) {
	reg := newTestRegistry(t, nil)
	a := testImage(t, 1, 4096)
	b := testImage(t, 1, 4096)
	push(t, reg.host+"/app:a", a)
	push(t, reg.host+"/app:b", b)
	dir := t.TempDir()
	p1, err := New(testOptions(dir))
	if err != nil {
		t.Fatal(err)
	}
	fetchAll(t, p1, Source{Ref: reg.host + "/app:b"}, compressedLayers(t, b))
	fetchAll(t, p1, Source{Ref: reg.host + "/app:a"}, compressedLayers(t, a))
	// Make b the older blob on disk, then use it again: the use must be
	// recorded in the file so that a restart sees a as the LRU blob.
	old := time.Now().Add(-2 * time.Hour)
	for _, d := range append(layerDigests(t, a), layerDigests(t, b)...) {
		if err := os.Chtimes(blobPath(dir, d), old, old); err != nil {
			t.Fatal(err)
		}
	}
	older := old.Add(-time.Hour)
	for _, d := range layerDigests(t, b) {
		if err := os.Chtimes(blobPath(dir, d), older, older); err != nil {
			t.Fatal(err)
		}
	}
	fetchAll(t, p1, Source{Ref: reg.host + "/app:b"}, compressedLayers(t, b))
	p1.Close()

	newTestPuller(t, Options{CacheDir: dir, CacheQuotaBytes: imageSize(t, b)})
	for _, d := range layerDigests(t, a) {
		if exists(t, blobPath(dir, d)) {
			t.Errorf("blob %s of the least recently used image survived New", d)
		}
	}
	for _, d := range layerDigests(t, b) {
		if !exists(t, blobPath(dir, d)) {
			t.Errorf("blob %s of the recently used image was evicted", d)
		}
	}
}

func TestCorruptCachedBlobRefetched(t *testing.T) {
	reg := newTestRegistry(t, nil)
	img := testImage(t, 3, 4096)
	push(t, reg.host+"/app:v1", img)
	want := compressedLayers(t, img)
	src := Source{Ref: reg.host + "/app:v1"}
	ds := layerDigests(t, img)

	for _, tc := range []struct {
		name    string
		corrupt func(path string) error
	}{
		{"FlippedByte", func(path string) error {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			b[len(b)/2] ^= 0xff
			return os.WriteFile(path, b, 0o644)
		}},
		{"Truncated", func(path string) error { return os.Truncate(path, 10) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p1, err := New(testOptions(dir))
			if err != nil {
				t.Fatal(err)
			}
			fetchAll(t, p1, src, want)
			p1.Close()
			if err := tc.corrupt(blobPath(dir, ds[1])); err != nil {
				t.Fatal(err)
			}
			reg.reset()
			p2 := newTestPuller(t, Options{CacheDir: dir})
			fetchAll(t, p2, src, want)
			for i, d := range ds {
				wantGets := 0
				if i == 1 {
					wantGets = 1
				}
				if n := reg.blobGets(d); n != wantGets {
					t.Errorf("layer %d fetched %d times after corrupting layer 1, want %d", i, n, wantGets)
				}
			}
			if used, n := cacheUsage(p2); n != 3 || used != imageSize(t, img) {
				t.Errorf("cache usage = %d bytes, %d blobs; want %d, 3", used, n, imageSize(t, img))
			}
		})
	}
}

func TestDigestMismatch(t *testing.T) {
	img := testImage(t, 1, 4096)
	d := layerDigests(t, img)[0]
	reg := newTestRegistry(t, blobWrapper([]v1.Hash{d}, func(w http.ResponseWriter, r *http.Request, h http.Handler) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		body := rec.Body.Bytes()
		body[len(body)/2] ^= 0xff
		w.WriteHeader(rec.Code)
		w.Write(body)
	}))
	push(t, reg.host+"/app:v1", img)
	dir := t.TempDir()
	p := newTestPuller(t, Options{CacheDir: dir})
	err := fetchErr(t, p, reg.host+"/app:v1")
	if !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("Fetch error = %v, want ErrDigestMismatch", err)
	}
	for _, s := range []string{"fetch layer " + d.String() + " from " + reg.host + "/app", "expected " + d.String() + ", got sha256:"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not contain %q", err, s)
		}
	}
	blobs, temps := cacheFiles(t, dir)
	if len(blobs) != 0 || len(temps) != 0 {
		t.Errorf("cache holds blobs %v and temp files %v after a failed download", blobs, temps)
	}
	if used, n := cacheUsage(p); used != 0 || n != 0 {
		t.Errorf("cache usage = %d, %d; want 0, 0", used, n)
	}
}

func TestMissingBlob(t *testing.T) {
	img := testImage(t, 2, 1024)
	d := layerDigests(t, img)[1]
	reg := newTestRegistry(t, blobWrapper([]v1.Hash{d}, func(w http.ResponseWriter, r *http.Request, h http.Handler) {
		http.Error(w, `{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown"}]}`, http.StatusNotFound)
	}))
	push(t, reg.host+"/app:v1", img)
	p := newTestPuller(t, Options{})
	err := fetchErr(t, p, reg.host+"/app:v1")
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("Fetch error = %v, want ErrNotFound", err)
	}
	want := "fetch layer " + d.String() + " from " + reg.host + "/app: unexpected status 404"
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not contain %q", err, want)
	}
	// The layer that did download stays cached but unpinned.
	if st := p.cache.Stats(); st.Pinned != 0 {
		t.Errorf("%d blobs still pinned after a failed Fetch", st.Pinned)
	}
}

func TestCancelMidDownload(t *testing.T) {
	img := testImage(t, 1, 1<<20)
	started := make(chan struct{})
	var once sync.Once
	reg := newTestRegistry(t, blobWrapper(layerDigests(t, img), func(w http.ResponseWriter, r *http.Request, h http.Handler) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		w.Header().Set("Content-Length", rec.Header().Get("Content-Length"))
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes()[:64<<10])
		w.(http.Flusher).Flush()
		once.Do(func() { close(started) })
		<-r.Context().Done() // stall until the client goes away
	}))
	push(t, reg.host+"/app:v1", img)
	dir := t.TempDir()
	p := newTestPuller(t, Options{CacheDir: dir})
	resolved, err := p.Resolve(context.Background(), Source{Ref: reg.host + "/app:v1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var progressed []Progress
	done := make(chan error, 1)
	go func() {
		_, err := p.Fetch(ctx, resolved, func(pr Progress) { progressed = append(progressed, pr) })
		done <- err
	}()
	<-started
	cancel()
	err = <-done
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Fetch error = %v, want context.Canceled", err)
	}
	blobs, temps := cacheFiles(t, dir)
	if len(blobs) != 0 || len(temps) != 0 {
		t.Errorf("cache holds blobs %v and temp files %v after cancellation", blobs, temps)
	}
	for _, pr := range progressed {
		if pr.CompletedLayers != 0 {
			t.Errorf("progress %+v reports a completed layer", pr)
		}
	}
}

func TestProgress(t *testing.T) {
	base := testImage(t, 1, 4096)
	img := withLayers(t, base, 2, 256<<10)
	slow := layerDigests(t, img)[1:]
	// Serve the two new layers in 8 KiB chunks, 40 ms apart: each takes more
	// than a second, so reports arrive while bytes move.
	reg := newTestRegistry(t, blobWrapper(slow, func(w http.ResponseWriter, r *http.Request, h http.Handler) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		w.Header().Set("Content-Length", rec.Header().Get("Content-Length"))
		w.WriteHeader(rec.Code)
		body := rec.Body.Bytes()
		for off := 0; off < len(body); off += 8 << 10 {
			w.Write(body[off:min(off+8<<10, len(body))])
			w.(http.Flusher).Flush()
			select {
			case <-time.After(40 * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
	}))
	push(t, reg.host+"/app:base", base)
	push(t, reg.host+"/app:v1", img)
	p := newTestPuller(t, Options{})
	fetchAll(t, p, Source{Ref: reg.host + "/app:base"}, compressedLayers(t, base))

	resolved, err := p.Resolve(context.Background(), Source{Ref: reg.host + "/app:v1"})
	if err != nil {
		t.Fatal(err)
	}
	var reports []Progress
	ls, err := p.Fetch(context.Background(), resolved, func(pr Progress) { reports = append(reports, pr) })
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	checkLayers(t, ls, resolved, compressedLayers(t, img))

	if len(reports) < 2 {
		t.Fatalf("got %d progress reports, want intermediate ones and a final one", len(reports))
	}
	intermediate := false
	for i, pr := range reports {
		if pr.TotalBytes != resolved.CompressedSize || pr.TotalLayers != 3 {
			t.Errorf("report %d totals = %d bytes, %d layers; want %d, 3", i, pr.TotalBytes, pr.TotalLayers, resolved.CompressedSize)
		}
		if i > 0 && (pr.DownloadedBytes < reports[i-1].DownloadedBytes || pr.CompletedLayers < reports[i-1].CompletedLayers) {
			t.Errorf("report %d %+v goes back from %+v", i, pr, reports[i-1])
		}
		if pr.DownloadedBytes > pr.TotalBytes || pr.CompletedLayers > pr.TotalLayers {
			t.Errorf("report %d %+v exceeds the totals", i, pr)
		}
		if i < len(reports)-1 && pr.DownloadedBytes > 0 && pr.DownloadedBytes < pr.TotalBytes {
			intermediate = true
			if pr.CompletedLayers < 1 {
				t.Errorf("report %d %+v: the cached layer should count as completed", i, pr)
			}
		}
	}
	if !intermediate {
		t.Errorf("no intermediate report with partial bytes among %+v", reports)
	}
	final := reports[len(reports)-1]
	if final.DownloadedBytes != resolved.CompressedSize || final.CompletedLayers != 3 || final.SpeedBPS <= 0 {
		t.Errorf("final report %+v, want all %d bytes and 3 layers at a positive speed", final, resolved.CompressedSize)
	}
}

func TestLayersOpenAfterClose(t *testing.T) {
	reg := newTestRegistry(t, nil)
	img := testImage(t, 1, 512)
	push(t, reg.host+"/app:v1", img)
	p := newTestPuller(t, Options{})
	resolved, err := p.Resolve(context.Background(), Source{Ref: reg.host + "/app:v1"})
	if err != nil {
		t.Fatal(err)
	}
	ls, err := p.Fetch(context.Background(), resolved, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ls.Open(1); err == nil {
		t.Error("Open(1) of a one-layer image succeeded")
	}
	rc, err := ls.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	ls.Close()
	ls.Close()
	if _, err := ls.Open(0); err == nil {
		t.Error("Open after Close succeeded")
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(rc); err != nil || int64(buf.Len()) != resolved.Layers[0].Size {
		t.Errorf("reader opened before Close: %d bytes, %v", buf.Len(), err)
	}
	rc.Close()
	if _, err := p.Fetch(context.Background(), &Image{}, nil); err == nil {
		t.Error("Fetch of an Image not from Resolve succeeded")
	}
}
