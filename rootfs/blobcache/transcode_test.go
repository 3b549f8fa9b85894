package blobcache

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// zstdFiles lists the committed zstd forms and the temp files in a cache dir.
func zstdFiles(t testing.TB, cacheDir string) (forms, temps []string) {
	t.Helper()
	des, err := os.ReadDir(filepath.Join(cacheDir, "blobs", "zstd"))
	if err != nil {
		t.Fatalf("read zstd dir: %v", err)
	}
	for _, de := range des {
		if strings.HasPrefix(de.Name(), tmpPrefix) {
			temps = append(temps, de.Name())
		} else {
			forms = append(forms, de.Name())
		}
	}
	return forms, temps
}

// filesBytes sums the sizes of the regular files under dir.
func filesBytes(t testing.TB, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || d.Name() == "lock" {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		n += fi.Size()
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
	return n
}

// openAll checks that every layer is in zstd form when wantZstd says so (as
// served otherwise) and returns the uncompressed streams.
func openAll(t testing.TB, ls *pins, wantZstd bool) [][]byte {
	t.Helper()
	var out [][]byte
	for i, blob := range readBlobs(t, ls) {
		if isZstd := bytes.HasPrefix(blob, zstdMagic); isZstd != wantZstd {
			t.Fatalf("layer %d: zstd form = %v, want %v (starts % x)", i, isZstd, wantZstd, blob[:4])
		}
		out = append(out, inflate(t, blob))
	}
	return out
}

var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

// inflate returns the uncompressed stream of a zstd, gzip or plain blob.
func inflate(t testing.TB, blob []byte) []byte {
	t.Helper()
	var r io.Reader = bytes.NewReader(blob)
	switch {
	case bytes.HasPrefix(blob, zstdMagic):
		d, err := zstd.NewReader(r)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		r = d
	case bytes.HasPrefix(blob, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(r)
		if err != nil {
			t.Fatal(err)
		}
		r = zr
	}
	raw, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("inflate: %v", err)
	}
	return raw
}

func waitTranscodes(t testing.TB, c *Cache) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if c.tc == nil {
		return
	}
	if err := c.tc.waitIdle(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestTranscodeReplacesGzipWithZstd(t *testing.T) {
	reg, img := servedImage(t, 3, 256<<10)
	want := img.uncompressed()
	dir := t.TempDir()
	c := newTestCache(t, Options{Dir: dir, TranscodeZstd: true})

	ls := fetchImage(t, c, reg, img)
	if st := c.Stats(); st.ZstdBlobs != 0 || st.Transcoded != 0 {
		t.Errorf("transcoded while the layers are pinned: %+v", st)
	}
	ls.Close()
	waitTranscodes(t, c)
	st := c.Stats()
	if st.Blobs != 3 || st.ZstdBlobs != 3 || st.Transcoded != 3 || st.TranscodeFailures != 0 || st.TranscodePending != 0 {
		t.Errorf("Stats() = %+v, want 3 blobs, all zstd", st)
	}
	if served, _ := cacheFiles(t, dir); len(served) != 0 {
		t.Errorf("served blobs left beside their zstd forms: %v", served)
	}
	if forms, temps := zstdFiles(t, dir); len(forms) != 3 || len(temps) != 0 {
		t.Errorf("zstd dir holds %v and temps %v", forms, temps)
	}
	if used := filesBytes(t, dir); st.Bytes != used {
		t.Errorf("cache accounts %d bytes, the files take %d", st.Bytes, used)
	}

	reg.reset()
	ls = fetchImage(t, c, reg, img)
	got := openAll(t, ls, true)
	ls.Close()
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("layer %d: zstd form inflates to %d bytes differing from the layer's %d", i, len(got[i]), len(want[i]))
		}
	}
	if n := reg.layerGets(img); n != 0 {
		t.Errorf("%d layer GETs with the zstd forms cached, want 0", n)
	}
	if st := c.Stats(); st.Transcoded != 3 {
		t.Errorf("zstd forms transcoded again: %+v", st)
	}

	// After a restart the zstd forms are verified against their names and used.
	c.Close()
	c2 := newTestCache(t, Options{Dir: dir, TranscodeZstd: true})
	if st := c2.Stats(); st.Blobs != 3 || st.ZstdBlobs != 3 || st.Bytes != filesBytes(t, dir) {
		t.Errorf("after restart Stats() = %+v, files take %d bytes", st, filesBytes(t, dir))
	}
	ls = fetchImage(t, c2, reg, img)
	got = openAll(t, ls, true)
	ls.Close()
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("after restart, layer %d differs", i)
		}
	}
	if n := reg.layerGets(img); n != 0 {
		t.Errorf("%d layer GETs after restart, want 0", n)
	}
}

func TestTranscodeTornZstdFormIsRefetched(t *testing.T) {
	reg, img := servedImage(t, 2, 128<<10)
	dir := t.TempDir()
	c := newTestCache(t, Options{Dir: dir, TranscodeZstd: true})
	fetchImage(t, c, reg, img).Close()
	waitTranscodes(t, c)
	c.Close()

	forms, _ := zstdFiles(t, dir)
	if len(forms) != 2 {
		t.Fatalf("zstd forms: %v", forms)
	}
	torn := filepath.Join(dir, "blobs", "zstd", forms[0])
	if err := os.Truncate(torn, 100); err != nil {
		t.Fatal(err)
	}
	reg.reset()
	c2 := newTestCache(t, Options{Dir: dir, TranscodeZstd: true})
	ls := fetchImage(t, c2, reg, img)
	if n := reg.layerGets(img); n != 1 {
		t.Errorf("%d layer GETs, want 1 (the torn layer only)", n)
	}
	if exists(t, torn) {
		t.Errorf("torn zstd form %s kept", torn)
	}
	// The torn layer comes as served now, the other as zstd.
	want := img.uncompressed()
	for i, blob := range readBlobs(t, ls) {
		if !bytes.Equal(inflate(t, blob), want[i]) {
			t.Fatalf("layer %d differs from the pushed one", i)
		}
	}
	ls.Close()
	waitTranscodes(t, c2)
	if st := c2.Stats(); st.ZstdBlobs != 2 || st.Bytes != filesBytes(t, dir) {
		t.Errorf("Stats() = %+v, files take %d bytes", st, filesBytes(t, dir))
	}
}

func TestTranscodeWhilePinnedKeepsServedFormUntilUnpinned(t *testing.T) {
	reg, img := servedImage(t, 1, 128<<10)
	dir := t.TempDir()
	c := newTestCache(t, Options{Dir: dir, TranscodeZstd: true})
	// As if the build holding the blob had started between the
	// transcoder's last look and its commit: it does not wait.
	c.tc.builds = func() <-chan struct{} { return nil }

	held := fetchImage(t, c, reg, img)
	other := fetchImage(t, c, reg, img)
	other.Close() // queues the blob while held still pins it
	waitTranscodes(t, c)
	served := blobPath(dir, img.digests()[0])
	if !exists(t, served) {
		t.Fatal("served form removed while a Layers holds it")
	}
	if st := c.Stats(); st.ZstdBlobs != 1 || st.Bytes != filesBytes(t, dir) {
		t.Errorf("Stats() = %+v, files take %d bytes", st, filesBytes(t, dir))
	}
	openAll(t, held, true) // new opens get the zstd form
	held.Close()
	if exists(t, served) {
		t.Error("served form kept after the last unpin")
	}
	if st := c.Stats(); st.Bytes != filesBytes(t, dir) {
		t.Errorf("Stats() = %+v, files take %d bytes", st, filesBytes(t, dir))
	}
}

// waitPaused waits until the transcoder says it waits for builds.
func waitPaused(t testing.TB, c *Cache) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !c.Stats().TranscodePaused {
		if time.Now().After(deadline) {
			t.Fatalf("transcoder never paused: %+v", c.Stats())
		}
		time.Sleep(time.Millisecond)
	}
}

func TestTranscodeWaitsForBuilds(t *testing.T) {
	reg, img := servedImage(t, 1, 256<<10)
	other := randomImage(t, 1, 64<<10)
	reg2 := newOrigin(other)
	dir := t.TempDir()
	c := newTestCache(t, Options{Dir: dir, TranscodeZstd: true})

	build := fetchImage(t, c, reg2, other) // a build in progress
	fetchImage(t, c, reg, img).Close()     // queues img's blob
	waitPaused(t, c)
	if st := c.Stats(); st.ZstdBlobs != 0 || st.TranscodePending != 1 {
		t.Errorf("Stats() = %+v while a build holds the cache, want nothing transcoded and one pending", st)
	}
	if forms, temps := zstdFiles(t, dir); len(forms)+len(temps) != 0 {
		t.Errorf("zstd dir holds %v and temps %v while a build holds the cache", forms, temps)
	}
	build.Close()
	waitTranscodes(t, c)
	if st := c.Stats(); st.ZstdBlobs != 2 || st.TranscodePaused || st.Bytes != filesBytes(t, dir) {
		t.Errorf("Stats() = %+v after the build, want both blobs in zstd form; files take %d bytes", st, filesBytes(t, dir))
	}
}

func TestTranscodeMidBlobGivesWayToABuild(t *testing.T) {
	reg, img := servedImage(t, 1, 8<<20)
	other := randomImage(t, 1, 64<<10)
	reg2 := newOrigin(other)
	dir := t.TempDir()
	c := newTestCache(t, Options{Dir: dir, TranscodeZstd: true})
	// The first look (before the blob) and the second (its first read)
	// pass; the third, with the encoder and its temp file open, waits
	// until the test has started a build.
	started, building := make(chan struct{}), make(chan struct{})
	looks := 0
	c.tc.builds = func() <-chan struct{} {
		looks++
		switch looks {
		case 1, 2:
			return nil
		case 3:
			close(started)
			<-building
		}
		return c.usersDone()
	}
	fetchImage(t, c, reg, img).Close()
	<-started
	build := fetchImage(t, c, reg2, other)
	close(building)
	waitPaused(t, c)
	// The interrupted transcode is abandoned, its encoder and temp file
	// with it, rather than held through the build.
	if forms, temps := zstdFiles(t, dir); len(forms)+len(temps) != 0 {
		t.Errorf("zstd forms %v and temps %v kept while a build holds the cache", forms, temps)
	}
	if !exists(t, blobPath(dir, img.digests()[0])) {
		t.Error("served form removed while its transcode waits")
	}
	if st := c.Stats(); st.TranscodeFailures != 0 || st.TranscodePending != 1 {
		t.Errorf("Stats() = %+v while the build runs, want the interrupted blob pending and no failure", st)
	}
	build.Close()
	waitTranscodes(t, c)
	if st := c.Stats(); st.ZstdBlobs != 2 || st.Transcoded != 2 {
		t.Errorf("Stats() = %+v, want both blobs transcoded once the build ended", st)
	}
	reg.reset()
	ls := fetchImage(t, c, reg, img)
	if got := openAll(t, ls, true); !bytes.Equal(got[0], img.uncompressed()[0]) {
		t.Error("the restarted transcode inflates to other bytes than the layer")
	}
	ls.Close()
}

func TestTranscodeStopsWhilePaused(t *testing.T) {
	reg, img := servedImage(t, 1, 128<<10)
	other := randomImage(t, 1, 64<<10)
	dir := t.TempDir()
	c := newTestCache(t, Options{Dir: dir, TranscodeZstd: true})
	build := fetchImage(t, c, newOrigin(other), other)
	defer build.Close()
	fetchImage(t, c, reg, img).Close()
	waitPaused(t, c)
	if err := c.Close(); err != nil { // must not wait for the build
		t.Fatal(err)
	}
	if forms, temps := zstdFiles(t, dir); len(forms)+len(temps) != 0 {
		t.Errorf("after Close: zstd forms %v, temps %v", forms, temps)
	}
}

func TestTranscodeLeavesOtherBlobsAlone(t *testing.T) {
	plainTar := images.TarOf(t, map[string]string{"etc/plain": "uncompressed layer"})
	notReallyGzip := append([]byte{0x1f, 0x8b}, bytes.Repeat([]byte("not deflate "), 100)...)
	img := staticImage(plainTar, notReallyGzip)
	reg := newOrigin(img)
	dir := t.TempDir()
	c := newTestCache(t, Options{Dir: dir, TranscodeZstd: true})
	fetchImage(t, c, reg, img).Close()
	waitTranscodes(t, c)
	st := c.Stats()
	if st.ZstdBlobs != 0 || st.Transcoded != 0 || st.TranscodeFailures != 1 {
		t.Errorf("Stats() = %+v, want no zstd form and one failure (the broken gzip)", st)
	}
	if served, temps := cacheFiles(t, dir); len(served) != 2 || len(temps) != 0 {
		t.Errorf("served blobs %v, temps %v; want both kept", served, temps)
	}
	if _, temps := zstdFiles(t, dir); len(temps) != 0 {
		t.Errorf("temp files left: %v", temps)
	}
	ls := fetchImage(t, c, reg, img)
	checkBlobs(t, ls, [][]byte{plainTar, notReallyGzip})
	ls.Close()
	waitTranscodes(t, c)
	if st := c.Stats(); st.TranscodeFailures != 1 {
		t.Errorf("a failed blob was tried again: %+v", st)
	}
}

func TestTranscodeCorruptedServedBlobIsVerifiedAgain(t *testing.T) {
	reg, img := servedImage(t, 1, 256<<10)
	dir := t.TempDir()
	c := newTestCache(t, Options{Dir: dir}) // fetch without transcoding
	fetchImage(t, c, reg, img).Close()
	c.Close()

	// The next process verifies the blob, then it rots before the transcode.
	c2 := newTestCache(t, Options{Dir: dir, TranscodeZstd: true})
	ls := fetchImage(t, c2, reg, img)
	served := blobPath(dir, img.digests()[0])
	b, err := os.ReadFile(served)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 0xff // the gzip trailer: inflating fails or the digest does
	if err := os.WriteFile(served, b, 0o644); err != nil {
		t.Fatal(err)
	}
	ls.Close()
	waitTranscodes(t, c2)
	if st := c2.Stats(); st.ZstdBlobs != 0 || st.TranscodeFailures != 1 {
		t.Errorf("Stats() = %+v, want no zstd form and one failure", st)
	}
	reg.reset()
	ls = fetchImage(t, c2, reg, img)
	checkBlobs(t, ls, img.compressed())
	ls.Close()
	if n := reg.layerGets(img); n != 1 {
		t.Errorf("%d layer GETs, want 1: the rotten blob must be verified again and refetched", n)
	}
}

func TestTranscodeStopsWithTheCache(t *testing.T) {
	reg, img := servedImage(t, 1, 48<<20)
	dir := t.TempDir()
	c := newTestCache(t, Options{Dir: dir, TranscodeZstd: true})
	fetchImage(t, c, reg, img).Close()
	// Close cancels the transcode, which may or may not have finished.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	forms, temps := zstdFiles(t, dir)
	if len(temps) != 0 {
		t.Errorf("temp files left after Close: %v", temps)
	}
	served, _ := cacheFiles(t, dir)
	if len(forms)+len(served) != 1 {
		t.Errorf("after Close: zstd %v, served %v; want exactly one form", forms, served)
	}
	reg.reset()
	c2 := newTestCache(t, Options{Dir: dir, TranscodeZstd: true})
	ls := fetchImage(t, c2, reg, img)
	ls.Close()
	if n := reg.layerGets(img); n != 0 {
		t.Errorf("%d layer GETs after a stopped transcode, want 0", n)
	}
	waitTranscodes(t, c2)
	if st := c2.Stats(); st.ZstdBlobs != 1 {
		t.Errorf("Stats() = %+v, want the blob transcoded after restart", st)
	}
}

func TestTranscodeEvictionCountsZstdForms(t *testing.T) {
	a := randomImage(t, 2, 256<<10)
	b := randomImage(t, 2, 256<<10)
	reg := newOrigin(a, b)
	dir := t.TempDir()
	// Room for one image in either form (random data does not compress),
	// not for a layer more.
	quota := b.size() + b.size()/10
	c := newTestCache(t, Options{Dir: dir, TranscodeZstd: true, QuotaBytes: quota})
	fetchImage(t, c, reg, a).Close()
	waitTranscodes(t, c)
	fetchImage(t, c, reg, b).Close()
	waitTranscodes(t, c)
	st := c.Stats()
	if st.Bytes > quota || st.Bytes != filesBytes(t, dir) {
		t.Errorf("Stats() = %+v with quota %d; files take %d bytes", st, quota, filesBytes(t, dir))
	}
	forms, _ := zstdFiles(t, dir)
	if len(forms) != 2 {
		t.Errorf("zstd forms %v, want the newer image's two", forms)
	}
	for _, f := range forms {
		for _, d := range a.digests() {
			if strings.HasPrefix(f, d) {
				t.Errorf("zstd form of the older image's layer %s kept over the quota", d)
			}
		}
	}
}

func TestZstdNameCarriesItsDigest(t *testing.T) {
	reg, img := servedImage(t, 1, 64<<10)
	dir := t.TempDir()
	c := newTestCache(t, Options{Dir: dir, TranscodeZstd: true})
	fetchImage(t, c, reg, img).Close()
	waitTranscodes(t, c)
	forms, _ := zstdFiles(t, dir)
	if len(forms) != 1 {
		t.Fatalf("zstd forms: %v", forms)
	}
	b, err := os.ReadFile(filepath.Join(dir, "blobs", "zstd", forms[0]))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	if want := img.digests()[0] + "-" + hex.EncodeToString(sum[:]); forms[0] != want {
		t.Errorf("zstd form named %s, want %s", forms[0], want)
	}
}

// TestTranscodeCorruptionFoundWhilePinned: a blob found changed by the
// transcoder while another Layers pins it is verified again only once
// unpinned, so the pins of the entry are never lost to a replacement.
func TestTranscodeCorruptionFoundWhilePinned(t *testing.T) {
	reg, img := servedImage(t, 1, 256<<10)
	dir := t.TempDir()
	c := newTestCache(t, Options{Dir: dir, TranscodeZstd: true})
	c.tc.builds = func() <-chan struct{} { return nil } // transcode under held's pin
	held := fetchImage(t, c, reg, img)
	other := fetchImage(t, c, reg, img)
	served := blobPath(dir, img.digests()[0])
	b, err := os.ReadFile(served)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(served, b, 0o644); err != nil {
		t.Fatal(err)
	}
	other.Close()
	waitTranscodes(t, c)
	if st := c.Stats(); st.TranscodeFailures != 1 || st.ZstdBlobs != 0 {
		t.Errorf("Stats() = %+v, want one failure", st)
	}
	// Still pinned by held: nothing is replaced under it, and no second
	// transcode is attempted.
	again := fetchImage(t, c, reg, img)
	again.Close()
	waitTranscodes(t, c)
	if st := c.Stats(); st.TranscodeFailures != 1 {
		t.Errorf("suspect blob transcoded again while pinned: %+v", st)
	}
	reg.reset()
	held.Close()
	ls := fetchImage(t, c, reg, img)
	checkBlobs(t, ls, img.compressed())
	ls.Close()
	if n := reg.layerGets(img); n != 1 {
		t.Errorf("%d layer GETs after the last unpin, want 1 (verified again, found corrupt, refetched)", n)
	}
	waitTranscodes(t, c)
	if st := c.Stats(); st.ZstdBlobs != 1 || st.Bytes != filesBytes(t, dir) {
		t.Errorf("Stats() = %+v, files take %d bytes; want the refetched blob transcoded", st, filesBytes(t, dir))
	}
}

// TestTranscodeNoSpace: a disk too full for the zstd form leaves the served
// blob in place and usable, counts a failure and leaves no temp file.
func TestTranscodeNoSpace(t *testing.T) {
	dir := imagetest.Tmpfs(t, "5m")
	reg, img := servedImage(t, 1, 3<<20) // random: the zstd form is as big as the blob
	c := newTestCache(t, Options{Dir: dir, TranscodeZstd: true})
	fetchImage(t, c, reg, img).Close()
	waitTranscodes(t, c)
	if st := c.Stats(); st.TranscodeFailures != 1 || st.ZstdBlobs != 0 || st.Bytes != filesBytes(t, dir) {
		t.Errorf("Stats() = %+v, files take %d bytes; want one failure, the served blob kept", st, filesBytes(t, dir))
	}
	if _, temps := zstdFiles(t, dir); len(temps) != 0 {
		t.Errorf("temp files left: %v", temps)
	}
	reg.reset()
	ls := fetchImage(t, c, reg, img)
	checkBlobs(t, ls, img.compressed())
	ls.Close()
	if n := reg.layerGets(img); n != 0 {
		t.Errorf("%d layer GETs, want 0: the served blob is still cached", n)
	}
}
