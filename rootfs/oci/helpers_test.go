package oci

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// testRegistry is go-containerregistry's in-memory registry on httptest,
// counting the requests it serves.
type testRegistry struct {
	srv  *httptest.Server
	host string

	mu        sync.Mutex
	blobGETs  map[string]int // by "sha256:<hex>"
	manifests int
	requests  int
}

// newTestRegistry starts a registry; wrap, if not nil, wraps its handler
// (inside the request counter).
func newTestRegistry(t testing.TB, wrap func(http.Handler) http.Handler) *testRegistry {
	t.Helper()
	r := &testRegistry{blobGETs: make(map[string]int)}
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.requests++
		if req.Method == http.MethodGet {
			if i := strings.Index(req.URL.Path, "/blobs/"); i >= 0 {
				r.blobGETs[req.URL.Path[i+len("/blobs/"):]]++
			}
			if strings.Contains(req.URL.Path, "/manifests/") {
				r.manifests++
			}
		}
		r.mu.Unlock()
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	r.host = strings.TrimPrefix(r.srv.URL, "http://")
	return r
}

// blobGets returns how often blob d was fetched.
func (r *testRegistry) blobGets(d v1.Hash) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.blobGETs[d.String()]
}

// layerGets sums the GETs of img's layer blobs.
func (r *testRegistry) layerGets(t testing.TB, img v1.Image) int {
	t.Helper()
	n := 0
	for _, d := range layerDigests(t, img) {
		n += r.blobGets(d)
	}
	return n
}

func (r *testRegistry) requestCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests
}

func (r *testRegistry) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.blobGETs = make(map[string]int)
	r.manifests, r.requests = 0, 0
}

// push writes img to ref, with extra remote options (e.g. auth).
func push(t testing.TB, ref string, img v1.Image, opts ...remote.Option) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatalf("parse %s: %v", ref, err)
	}
	if err := remote.Write(r, img, opts...); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

// testImage makes a random image with layers of about size bytes each and a
// config with every field Image.Config keeps.
func testImage(t testing.TB, layers int, size int64) v1.Image {
	t.Helper()
	img, err := random.Image(size, int64(layers))
	if err != nil {
		t.Fatalf("random image: %v", err)
	}
	img, err = mutate.Config(img, v1.Config{
		Entrypoint: []string{"/bin/entry", "--flag"},
		Cmd:        []string{"serve"},
		Env:        []string{"PATH=/usr/bin:/bin", "A=b"},
		WorkingDir: "/srv",
		User:       "1000:1000",
	})
	if err != nil {
		t.Fatalf("set config: %v", err)
	}
	img, err = mutate.CreatedAt(img, v1.Time{Time: time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)})
	if err != nil {
		t.Fatalf("set created: %v", err)
	}
	return img
}

// withLayers appends n fresh random layers to base.
func withLayers(t testing.TB, base v1.Image, n int, size int64) v1.Image {
	t.Helper()
	for range n {
		l, err := random.Layer(size, "application/vnd.docker.image.rootfs.diff.tar.gzip")
		if err != nil {
			t.Fatalf("random layer: %v", err)
		}
		if base, err = mutate.AppendLayers(base, l); err != nil {
			t.Fatalf("append layer: %v", err)
		}
	}
	return base
}

func mustDigest(t testing.TB, img v1.Image) v1.Hash {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatalf("image digest: %v", err)
	}
	return d
}

func layerDigests(t testing.TB, img v1.Image) []v1.Hash {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatalf("manifest: %v", err)
	}
	var out []v1.Hash
	for _, l := range m.Layers {
		out = append(out, l.Digest)
	}
	return out
}

// compressedLayers returns the compressed bytes of every layer of img.
func compressedLayers(t testing.TB, img v1.Image) [][]byte {
	return layerStreams(t, img, v1.Layer.Compressed)
}

func layerStreams(t testing.TB, img v1.Image, open func(v1.Layer) (io.ReadCloser, error)) [][]byte {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatalf("layers: %v", err)
	}
	var out [][]byte
	for _, l := range ls {
		rc, err := open(l)
		if err != nil {
			t.Fatalf("open layer: %v", err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatalf("read layer: %v", err)
		}
		out = append(out, b)
	}
	return out
}

func imageSize(t testing.TB, img v1.Image) int64 {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatalf("manifest: %v", err)
	}
	var n int64
	for _, l := range m.Layers {
		n += l.Size
	}
	return n
}

// emptyKeychain resolves every registry to anonymous, so tests do not pick
// up the host's docker credentials.
var emptyKeychain authn.Keychain = authn.NewMultiKeychain()

// testNetworks is the AllowNetworks of newTestPuller: the tests' registries
// listen on loopback, which the network policy denies by default.
var testNetworks = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

// testOptions are the Options of a test's own New: cache in dir, no
// credentials, the tests' loopback registries allowed.
func testOptions(dir string) Options {
	return Options{CacheDir: dir, Keychain: emptyKeychain, AllowNetworks: testNetworks}
}

// newTestPuller makes a Puller on a fresh cache dir (unless opts names one),
// allowed to reach the tests' loopback registries (unless opts sets
// AllowNetworks), and closes it at cleanup.
func newTestPuller(t testing.TB, opts Options) *Puller {
	t.Helper()
	if opts.AllowNetworks == nil {
		opts.AllowNetworks = testNetworks
	}
	return newStrictPuller(t, opts)
}

// newStrictPuller is newTestPuller with the network policy as opts gives
// it: loopback denied unless opts allows it.
func newStrictPuller(t testing.TB, opts Options) *Puller {
	t.Helper()
	if opts.CacheDir == "" {
		opts.CacheDir = t.TempDir()
	}
	if opts.Keychain == nil {
		opts.Keychain = emptyKeychain
	}
	p, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// fetchAll resolves and fetches ref and checks every blob against want.
func fetchAll(t testing.TB, p *Puller, src Source, want [][]byte) *Image {
	t.Helper()
	return fetchAllCtx(t, context.Background(), p, src, want)
}

// fetchAllCtx is fetchAll under ctx.
func fetchAllCtx(t testing.TB, ctx context.Context, p *Puller, src Source, want [][]byte) *Image {
	t.Helper()
	img, err := p.Resolve(ctx, src)
	if err != nil {
		t.Fatalf("Resolve(%s): %v", src.Ref, err)
	}
	ls, err := p.Fetch(ctx, img, nil)
	if err != nil {
		t.Fatalf("Fetch(%s): %v", src.Ref, err)
	}
	defer ls.Close()
	checkLayers(t, ls, img, want)
	return img
}

// checkLayers compares each opened blob with want and with its digest.
func checkLayers(t testing.TB, ls *Layers, img *Image, want [][]byte) {
	t.Helper()
	if ls.Len() != len(want) {
		t.Fatalf("Layers.Len() = %d, want %d", ls.Len(), len(want))
	}
	for i := range want {
		rc, err := ls.Open(i)
		if err != nil {
			t.Fatalf("Open(%d): %v", i, err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatalf("read layer %d: %v", i, err)
		}
		if !bytes.Equal(got, want[i]) {
			t.Fatalf("layer %d: got %d bytes differing from the %d pushed", i, len(got), len(want[i]))
		}
		sum := sha256.Sum256(got)
		if hex.EncodeToString(sum[:]) != img.Layers[i].Digest.Hex {
			t.Fatalf("layer %d: content does not hash to %s", i, img.Layers[i].Digest)
		}
	}
}

// tmpPrefix starts the names of the layer cache's partial blobs.
const tmpPrefix = ".tmp-"

// cacheFiles lists blob and temp file names in a cache dir.
func cacheFiles(t testing.TB, cacheDir string) (blobs, temps []string) {
	t.Helper()
	des, err := os.ReadDir(filepath.Join(cacheDir, "blobs", "sha256"))
	if err != nil {
		t.Fatalf("read cache dir: %v", err)
	}
	for _, de := range des {
		if strings.HasPrefix(de.Name(), tmpPrefix) {
			temps = append(temps, de.Name())
		} else {
			blobs = append(blobs, de.Name())
		}
	}
	return blobs, temps
}

func blobPath(cacheDir string, d v1.Hash) string {
	return filepath.Join(cacheDir, "blobs", "sha256", d.Hex)
}

func exists(t testing.TB, p string) bool {
	t.Helper()
	_, err := os.Stat(p)
	if err != nil && !os.IsNotExist(err) {
		t.Fatalf("stat %s: %v", p, err)
	}
	return err == nil
}

// cacheUsage returns the bytes and the number of blobs in p's cache.
func cacheUsage(p *Puller) (int64, int) {
	st := p.CacheStats()
	return st.Bytes, st.Blobs
}
