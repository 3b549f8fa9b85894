package blobcache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/inflatetest"
)

// testLayer is one layer blob and its uncompressed stream.
type testLayer struct {
	hex       string
	blob, raw []byte
}

// testImage is the layer list of an image, bottom first.
type testImage []testLayer

// randomImage makes n random gzip layers of about size bytes each, as
// go-containerregistry's random.Image does.
func randomImage(t testing.TB, n int, size int64) testImage {
	t.Helper()
	var img testImage
	for range n {
		l, err := random.Layer(size, types.DockerLayer)
		if err != nil {
			t.Fatalf("random layer: %v", err)
		}
		blob := readAll(t, l.Compressed)
		raw := readAll(t, l.Uncompressed)
		img = append(img, newLayer(blob, raw))
	}
	return img
}

// staticImage makes an image of the given blobs as they are.
func staticImage(blobs ...[]byte) testImage {
	var img testImage
	for _, b := range blobs {
		img = append(img, newLayer(b, nil))
	}
	return img
}

func newLayer(blob, raw []byte) testLayer {
	sum := sha256.Sum256(blob)
	return testLayer{hex: hex.EncodeToString(sum[:]), blob: blob, raw: raw}
}

func readAll(t testing.TB, open func() (io.ReadCloser, error)) []byte {
	t.Helper()
	rc, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (img testImage) digests() []string {
	var out []string
	for _, l := range img {
		out = append(out, l.hex)
	}
	return out
}

func (img testImage) compressed() [][]byte {
	var out [][]byte
	for _, l := range img {
		out = append(out, l.blob)
	}
	return out
}

func (img testImage) uncompressed() [][]byte {
	var out [][]byte
	for _, l := range img {
		out = append(out, l.raw)
	}
	return out
}

func (img testImage) size() int64 {
	var n int64
	for _, l := range img {
		n += int64(len(l.blob))
	}
	return n
}

// origin stands for the registry blobs are downloaded from, counting the
// downloads.
type origin struct {
	mu    sync.Mutex
	blobs map[string][]byte
	gets  map[string]int
}

func newOrigin(imgs ...testImage) *origin {
	o := &origin{blobs: make(map[string][]byte), gets: make(map[string]int)}
	for _, img := range imgs {
		for _, l := range img {
			o.blobs[l.hex] = l.blob
		}
	}
	return o
}

// servedImage makes a random image of n gzip layers of about size bytes and
// an origin serving it.
func servedImage(t testing.TB, n int, size int64) (*origin, testImage) {
	t.Helper()
	img := randomImage(t, n, size)
	return newOrigin(img), img
}

func (o *origin) open(hexDigest string) (io.Reader, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	b, ok := o.blobs[hexDigest]
	if !ok {
		return nil, fmt.Errorf("blob %s not served", hexDigest)
	}
	o.gets[hexDigest]++
	return bytes.NewReader(b), nil
}

// layerGets sums the downloads of img's blobs.
func (o *origin) layerGets(img testImage) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, l := range img {
		n += o.gets[l.hex]
	}
	return n
}

func (o *origin) reset() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.gets = make(map[string]int)
}

// pins holds the blobs of one image acquired from a cache, as a build does.
type pins struct {
	c   *Cache
	img testImage
}

// fetchImage acquires every blob of img, downloading missing ones from o.
func fetchImage(t testing.TB, c *Cache, o *origin, img testImage) *pins {
	t.Helper()
	ctx := context.Background()
	p := &pins{c: c}
	for _, l := range img {
		_, err := c.Acquire(ctx, l.hex, int64(len(l.blob)), "origin", func(ctx context.Context) error {
			r, err := o.open(l.hex)
			if err != nil {
				return err
			}
			return put(ctx, c, l.hex, int64(len(l.blob)), r)
		})
		if err != nil {
			p.Close()
			t.Fatalf("Acquire(%s): %v", l.hex, err)
		}
		p.img = append(p.img, l)
	}
	return p
}

// Close releases the pins.
func (p *pins) Close() { p.c.Release(p.img.digests()) }

// readBlobs reads every layer's blob as Open returns it.
func readBlobs(t testing.TB, p *pins) [][]byte {
	t.Helper()
	var out [][]byte
	for i, l := range p.img {
		rc, err := p.c.Open(l.hex)
		if err != nil {
			t.Fatalf("Open(%d): %v", i, err)
		}
		blob, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatalf("read layer %d: %v", i, err)
		}
		out = append(out, blob)
	}
	return out
}

// checkBlobs compares each opened blob with want and with its digest.
func checkBlobs(t testing.TB, p *pins, want [][]byte) {
	t.Helper()
	got := readBlobs(t, p)
	if len(got) != len(want) {
		t.Fatalf("%d blobs, want %d", len(got), len(want))
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("layer %d: got %d bytes differing from the %d served", i, len(got[i]), len(want[i]))
		}
		sum := sha256.Sum256(got[i])
		if hex.EncodeToString(sum[:]) != p.img[i].hex {
			t.Fatalf("layer %d: content does not hash to sha256:%s", i, p.img[i].hex)
		}
	}
}

// newTestCache opens a Cache on dir with a quota of 20 GiB unless opts sets
// one, and closes it at cleanup.
func newTestCache(t testing.TB, opts Options) *Cache {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	if opts.QuotaBytes == 0 {
		opts.QuotaBytes = 20 << 30
	}
	if opts.Gzip == nil {
		opts.Gzip = inflatetest.Inflater(t)
	}
	c, err := Open(opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	if c.tc != nil {
		// Transcodes start at once after a build unless a test asks for
		// the settle time (before any blob is queued, so before the
		// transcoder reads it).
		c.tc.settle = 0
	}
	return c
}

// cacheFiles lists served blob and temp file names in a cache dir.
func cacheFiles(t testing.TB, dir string) (blobs, temps []string) {
	t.Helper()
	des, err := os.ReadDir(filepath.Join(dir, "blobs", "sha256"))
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

func blobPath(dir, hexDigest string) string {
	return filepath.Join(dir, "blobs", "sha256", hexDigest)
}

func exists(t testing.TB, p string) bool {
	t.Helper()
	_, err := os.Stat(p)
	if err != nil && !os.IsNotExist(err) {
		t.Fatalf("stat %s: %v", p, err)
	}
	return err == nil
}

// put writes r into c as blob hexDigest, the way a download function of
// Acquire does: Create, Fill, Commit, or Abort on a failed read.
func put(ctx context.Context, c *Cache, hexDigest string, size int64, r io.Reader) error {
	p, err := c.Create(hexDigest, size)
	if err != nil {
		return err
	}
	if err := c.Fill(ctx, p, r, nil); err != nil {
		p.Abort(err)
		return err
	}
	return p.Commit()
}
