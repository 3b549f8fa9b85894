package rootfs_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/flatten"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
	"github.com/cubesandbox/cubetemplatecenter/test/linkproxy"
)

// heldBlob serves blob d's first half, then holds the rest until the
// client goes away (or the test ends). sent closes once the first half
// was flushed, gone once the client dropped the download.
type heldBlob struct {
	d          v1.Hash
	sent, gone chan struct{}
	end        chan struct{}
	sentOnce   sync.Once
}

func newHeldBlob(d v1.Hash) *heldBlob {
	return &heldBlob{d: d, sent: make(chan struct{}), gone: make(chan struct{}), end: make(chan struct{})}
}

// startRegistry starts a registry serving h's blob held; the hold ends
// before the registry closes.
func (h *heldBlob) startRegistry(t *testing.T) *images.Registry {
	reg := images.StartRegistry(t, h.wrap)
	t.Cleanup(func() { close(h.end) })
	return reg
}

func (h *heldBlob) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if d, ok := images.BlobDigest(req); !ok || d != h.d.String() || req.Method != http.MethodGet {
			next.ServeHTTP(w, req)
			return
		}
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, req)
		body := rec.Body.Bytes()
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(rec.Code)
		w.Write(body[:len(body)/2])
		w.(http.Flusher).Flush()
		h.sentOnce.Do(func() { close(h.sent) })
		select {
		case <-req.Context().Done():
			close(h.gone)
		case <-h.end:
		}
	})
}

// TestBuildCancelMidStream cancels a build while it applies a layer whose
// download is half done: Build returns the context's error and leaves
// nothing in the store or the layer cache.
func TestBuildCancelMidStream(t *testing.T) {
	img := corpusImage(t, []imagetest.Layer{{imagetest.Blob("a", 2<<20, 1)}}, images.Uncompressed)
	held := newHeldBlob(images.LayerDigests(t, img)[0])
	reg := held.startRegistry(t)
	ref := reg.Push(t, "stream/cancel:v1", img)
	opts := builderOptions(t, reg.Host)
	b := newBuilder(t, opts)
	imgR := resolve(t, b, rootfs.Source{Ref: ref})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := startBuild(ctx, b, specOf(imgR, ref, nil, nil), nil)
	cancelOnce(t, held.sent, cancel, done, opts, images.LayerDigests(t, img)[0])
}

// TestBuildLimitMidStream applies a layer with too many entries while its
// download is held half way: the entry limit stops the build from the
// bytes already received, without waiting for the rest, and the download
// is dropped.
func TestBuildLimitMidStream(t *testing.T) {
	var many imagetest.Layer
	// 5 MiB of tar headers: the half received fills the applier's 1 MiB
	// read-ahead chunks more than once.
	for i := range 10000 {
		many = append(many, imagetest.File("f"+strconv.Itoa(i)+strings.Repeat("x", 40), ""))
	}
	img := corpusImage(t, []imagetest.Layer{many}, images.Uncompressed)
	held := newHeldBlob(images.LayerDigests(t, img)[0])
	reg := held.startRegistry(t)
	ref := reg.Push(t, "stream/limit:v1", img)
	opts := builderOptions(t, reg.Host)
	opts.Limits.MaxEntries = 50
	b := newBuilder(t, opts)
	imgR := resolve(t, b, rootfs.Source{Ref: ref})
	done := startBuild(context.Background(), b, specOf(imgR, ref, nil, nil), nil)
	var r buildResult
	select {
	case r = <-done:
	case <-time.After(cancelBound):
		t.Fatalf("Build waited for the rest of a layer that already broke the entry limit")
	}
	var le *flatten.LimitError
	if !errors.As(r.err, &le) || le.Limit != flatten.LimitEntries {
		t.Fatalf("Build error = %v, want the %s limit", r.err, flatten.LimitEntries)
	}
	select {
	case <-held.gone:
	case <-time.After(cancelBound):
		t.Errorf("the held download was not dropped after the build failed")
	}
	checkStoreEmpty(t, opts.Store)
	checkCacheClean(t, opts.Pull.CacheDir, images.LayerDigests(t, img)[0])
}

// TestBuildThroughDroppedLink builds through a link model that cuts each
// layer's first download a third of the way: with ranges the downloads go
// on from the bytes received, without (the proxy strips Range, as a
// registry serving whole blobs) they start over and skip what is held.
// Both images hold the same tree.
func TestBuildThroughDroppedLink(t *testing.T) {
	layers := []imagetest.Layer{{imagetest.Blob("a", 3<<20, 1)}, {imagetest.Blob("b", 2<<20, 2)}}
	img := corpusImage(t, layers, images.Uncompressed)
	reg := images.StartRegistry(t, nil)
	ref := reg.Push(t, "link/app:v1", img)
	var first *imagetest.Snapshot
	for _, ranges := range []bool{true, false} {
		proxy, err := linkproxy.New(linkproxy.Options{Target: "http://" + reg.Host, BitsPerSecond: 400_000_000,
			ConnDelay: 5 * time.Millisecond, IgnoreRange: !ranges})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { proxy.Close() })
		for _, d := range images.LayerDigests(t, img) {
			proxy.CutAfter("/blobs/"+d.String(), 1<<20, 1)
		}
		opts := builderOptions(t, proxy.Addr())
		b := newBuilder(t, opts)
		viaProxy := strings.Replace(ref, reg.Host, proxy.Addr(), 1)
		got := buildOK(t, b, opts.Store, rootfs.Source{Ref: viaProxy}, len(layers), nil, nil)
		st := proxy.Stats()
		t.Logf("ranges %v: %+v", ranges, st)
		if st.Cuts != 2 {
			t.Errorf("ranges %v: %d cuts, want 2", ranges, st.Cuts)
		}
		// The client asks for the rest with Range either way; the proxy
		// counts it before it strips it.
		if st.RangeRequests != 2 {
			t.Errorf("ranges %v: %d Range requests, want 2", ranges, st.RangeRequests)
		}
		sent, total := st.BodyBytes, int64(0)
		for _, l := range images.LayerDigests(t, img) {
			total += int64(len(images.LayerBlob(t, img, l)))
		}
		// With ranges nothing is sent twice but the manifest and config;
		// without, each layer's first MiB is.
		if extra := sent - total; ranges && extra > 64<<10 || !ranges && extra < 2<<20 {
			t.Errorf("ranges %v: %d body bytes for %d of layers", ranges, sent, total)
		}
		if first == nil {
			first = &got.snap
		} else {
			checkWant(t, *first, got.snap)
		}
	}
}
