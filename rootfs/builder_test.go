package rootfs_test

// End-to-end tests of the Builder: images pushed to go-containerregistry's
// in-memory registry (or Debian's docker-registry, debian_test.go) are
// built into a store, then checked with e2fsck, a read-only loop mount
// compared with the expectation and with umoci's unpack, and a go-diskfs
// read-back. They need root (loop and tmpfs mounts), e2fsprogs and umoci.

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/flatten"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/inject"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/inspect"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/oci"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// encodings rotate over the corpus, so every rule also goes through each
// layer encoding.
var encodings = []images.Compression{images.Gzip, images.Zstd, images.Uncompressed}

// checkWant compares a build with a corpus expectation: every path, mtimes
// where the expectation sets one, the root only if it is listed, and not
// the lost+found the ext4 writer adds.
func checkWant(t testing.TB, want, got imagetest.Snapshot) {
	t.Helper()
	for _, d := range imagetest.Diff(want, got, imagetest.CheckOptions(want).SkipLostFound()) {
		t.Error(d)
	}
}

// TestBuildCorpus builds every corpus image from the in-memory registry
// and checks the artifact, e2fsck, the mount against the expectation and
// against umoci's unpack, and the go-diskfs read-back against the mount.
func TestBuildCorpus(t *testing.T) {
	reg := images.StartRegistry(t, nil)
	for i, c := range imagetest.Corpus() {
		t.Run(c.Name, func(t *testing.T) {
			if c.Large && testing.Short() {
				t.Skip("large image in -short mode")
			}
			img := corpusImage(t, c.Layers, encodings[i%len(encodings)])
			ref := reg.Push(t, "corpus/"+c.Name+":v1", img)
			opts := builderOptions(t, reg.Host)
			b := newBuilder(t, opts)
			res := buildOK(t, b, opts.Store, rootfs.Source{Ref: ref}, len(c.Layers), nil, nil)
			if res.art.CABaked || res.art.CATargets != 0 {
				t.Errorf("CABaked, CATargets = %v, %d without a CA", res.art.CABaked, res.art.CATargets)
			}
			checkWant(t, c.Want(), res.snap)
			if c.NoReference == "" {
				ref, err := imagetest.SnapshotDir(imagetest.UmociRootfs(t, c.Layers))
				if err != nil {
					t.Fatal(err)
				}
				for _, d := range imagetest.Diff(ref, res.snap, c.ReferenceOptions(ref).SkipLostFound()) {
					t.Errorf("differs from umoci: %s", d)
				}
			}
			entries, files := readBack(t, res.art.Path, res.mnt)
			t.Logf("read back %d entries and %d files through go-diskfs", entries, files)
			if entries != len(res.snap)-1 {
				t.Errorf("read back %d entries, the mount has %d paths besides the root", entries, len(res.snap)-1)
			}
		})
	}
}

// TestBuildHostile builds every hostile layer stack through one Builder:
// each build fails naming the refused entry, and the store stays empty.
func TestBuildHostile(t *testing.T) {
	reg := images.StartRegistry(t, nil)
	opts := builderOptions(t, reg.Host)
	b := newBuilder(t, opts)
	for _, c := range imagetest.Hostile() {
		t.Run(c.Name, func(t *testing.T) {
			ref := reg.Push(t, "hostile/"+strings.ToLower(c.Name)+":v1", corpusImage(t, c.Layers))
			img := resolve(t, b, rootfs.Source{Ref: ref})
			art, err := b.Build(context.Background(), specOf(img, ref, nil, nil), nil)
			if err == nil {
				t.Fatalf("Build succeeded (%s), want an error naming %q", art.Path, c.Entry)
			}
			last := len(c.Layers) - 1
			var ee *flatten.EntryError
			if !errors.As(err, &ee) || ee.Layer != last || ee.Name != c.Entry {
				t.Errorf("Build error = %v, want an EntryError for layer %d entry %q", err, last, c.Entry)
			}
			for _, want := range []string{c.Err, fmt.Sprintf("%q", c.Entry), fmt.Sprintf("layer %d", last)} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Build error %q does not contain %q", err, want)
				}
			}
			checkStoreEmpty(t, opts.Store)
			checkCacheClean(t, opts.Pull.CacheDir)
		})
	}
}

// determinismLayers is an image with hard links, xattrs, devices, a
// sparse file and a few MiB of data over three layers.
func determinismLayers() []imagetest.Layer {
	var layers []imagetest.Layer
	for _, c := range imagetest.Corpus() {
		switch c.Name {
		case "basic", "hardlinks", "xattrs", "sparse":
			layers = append(layers, c.Layers...)
		}
	}
	return append(layers, imagetest.Layer{
		imagetest.Dir("data/"),
		imagetest.Blob("data/one", 3<<20, 1),
		imagetest.Blob("data/two", 700<<10, 2),
		imagetest.File("etc/ssl/certs/ca-certificates.crt", ""),
	})
}

// TestBuildDeterministic builds one image, envd and CA twice, the second
// time with a fresh cache and store, and gets the same bytes; another envd
// or CA changes them, even under the same fingerprint.
func TestBuildDeterministic(t *testing.T) {
	reg := images.StartRegistry(t, nil)
	layers := determinismLayers()
	ref := reg.Push(t, "det/app:v1", corpusImage(t, layers, encodings...))
	_, caFile := newCA(t, "Cube Egress Test Root A")
	_, caFileB := newCA(t, "Cube Egress Test Root B")
	envd := fakeEnvd(1)

	build := func(t *testing.T, caPath string, envd []byte, fingerprint string) (*rootfs.Artifact, []byte) {
		t.Helper()
		opts := builderOptions(t, reg.Host)
		opts.CAPath = caPath
		b := newBuilder(t, opts)
		img := resolve(t, b, rootfs.Source{Ref: ref})
		ca, err := b.LoadCA(context.Background())
		if err != nil {
			t.Fatalf("LoadCA: %v", err)
		}
		spec := specOf(img, ref, envd, ca)
		if fingerprint != "" {
			spec.Fingerprint = fingerprint
		}
		art, err := b.Build(context.Background(), spec, nil)
		if err != nil {
			t.Fatalf("Build: %v", err)
		}
		checkArtifact(t, opts.Store, art)
		data, err := os.ReadFile(art.Path)
		if err != nil {
			t.Fatal(err)
		}
		return art, data
	}
	first, firstData := build(t, caFile, envd, "")
	imagetest.Fsck(t, first.Path)
	second, secondData := build(t, caFile, envd, "")
	if first.SHA256 != second.SHA256 || first.ID != second.ID || !bytes.Equal(firstData, secondData) {
		t.Errorf("two builds differ: %s (%s, %d bytes) and %s (%s, %d bytes)",
			first.ID, first.SHA256, len(firstData), second.ID, second.SHA256, len(secondData))
	}

	// Rebuilt from the zstd forms the cache re-encodes gzip layers to (after
	// a restart, so they are verified against their names), the image is
	// the same to the byte.
	t.Run("FromZstdCache", func(t *testing.T) {
		opts := builderOptions(t, reg.Host)
		opts.CAPath = caFile
		opts.Pull.TranscodeZstd = true
		buildWith := func(b *rootfs.Builder) []byte {
			t.Helper()
			img := resolve(t, b, rootfs.Source{Ref: ref})
			ca, err := b.LoadCA(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			art, err := b.Build(context.Background(), specOf(img, ref, envd, ca), nil)
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			data, err := os.ReadFile(art.Path)
			if err != nil {
				t.Fatal(err)
			}
			return data
		}
		b, err := rootfs.NewBuilder(opts)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buildWith(b), firstData) {
			t.Error("build with transcoding on differs before any transcode")
		}
		waitCacheIdle(t, b)
		gzipLayers := (len(layers) + len(encodings) - 1) / len(encodings)
		if st := b.CacheStats(); st.ZstdBlobs != gzipLayers || st.Transcoded != int64(gzipLayers) || st.TranscodeFailures != 0 {
			t.Errorf("CacheStats() = %+v, want the %d gzip layers in zstd form", st, gzipLayers)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		opts.Store = rootfs.Store(t.TempDir())
		b = newBuilder(t, opts)
		if data := buildWith(b); !bytes.Equal(data, firstData) {
			t.Errorf("build from zstd forms differs from the build from gzip (%d vs %d bytes)", len(data), len(firstData))
		}
		if st := b.CacheStats(); st.ZstdBlobs != gzipLayers || st.Transcoded != 0 {
			t.Errorf("after restart CacheStats() = %+v, want %d zstd forms reused", st, gzipLayers)
		}
	})

	// The same fingerprint (so the same UUID and hash seed) isolates the
	// effect of the content.
	ca, err := inject.LoadCA(caFile)
	if err != nil {
		t.Fatal(err)
	}
	sameFP := specOf(resolve(t, newBuilder(t, builderOptions(t, reg.Host)), rootfs.Source{Ref: ref}), ref, envd, ca).Fingerprint
	for _, c := range []struct {
		name   string
		caPath string
		envd   []byte
		fp     string
	}{
		{"OtherEnvd", caFile, fakeEnvd(2), ""},
		{"OtherCA", caFileB, envd, ""},
		{"OtherEnvdSameFingerprint", caFile, fakeEnvd(2), sameFP},
		{"OtherCASameFingerprint", caFileB, envd, sameFP},
	} {
		t.Run(c.name, func(t *testing.T) {
			art, _ := build(t, c.caPath, c.envd, c.fp)
			if art.SHA256 == first.SHA256 {
				t.Errorf("sha256 %s unchanged", art.SHA256)
			}
			imagetest.Fsck(t, art.Path)
		})
	}
}

// TestBuildPlatform pushes an index of linux/amd64 and linux/arm64 images
// with different content and builds the configured platform of it.
func TestBuildPlatform(t *testing.T) {
	reg := images.StartRegistry(t, nil)
	mk := func(arch string) v1.Image {
		raw, err := imagetest.Layer{imagetest.File("arch", arch), imagetest.File("only-"+arch, arch)}.Tar()
		if err != nil {
			t.Fatal(err)
		}
		return images.New(t, images.Config{Created: imageCreated, Platform: v1.Platform{OS: "linux", Architecture: arch}},
			images.Layer{Tar: raw})
	}
	amd, arm := mk("amd64"), mk("arm64")
	ref := reg.PushIndex(t, "multi/app:v1", images.NewIndex(t,
		images.PlatformImage{Platform: v1.Platform{OS: "linux", Architecture: "amd64"}, Image: amd},
		images.PlatformImage{Platform: v1.Platform{OS: "linux", Architecture: "arm64"}, Image: arm}))
	for arch, img := range map[string]v1.Image{"amd64": amd, "arm64": arm} {
		t.Run(arch, func(t *testing.T) {
			opts := builderOptions(t, reg.Host)
			opts.Pull.Platform = v1.Platform{OS: "linux", Architecture: arch}
			b := newBuilder(t, opts)
			res := buildOK(t, b, opts.Store, rootfs.Source{Ref: ref}, 1, nil, nil)
			d, err := img.Digest()
			if err != nil {
				t.Fatal(err)
			}
			if want := reg.Host + "/multi/app@" + d.String(); res.img.Digest != want {
				t.Errorf("Image.Digest = %s, want the %s manifest %s", res.img.Digest, arch, want)
			}
			checkWant(t, imagetest.Expect(imagetest.WFile("arch", 0o644, arch), imagetest.WFile("only-"+arch, 0o644, arch)), res.snap)
		})
	}
	t.Run("Missing", func(t *testing.T) {
		opts := builderOptions(t, reg.Host)
		opts.Pull.Platform = v1.Platform{OS: "linux", Architecture: "s390x"}
		_, err := newBuilder(t, opts).Resolve(context.Background(), rootfs.Source{Ref: ref})
		if !errors.Is(err, oci.ErrNoPlatform) || !strings.Contains(err.Error(), "linux/arm64") {
			t.Errorf("Resolve for linux/s390x: %v, want ErrNoPlatform listing linux/arm64", err)
		}
	})
}

// TestBuildEncodings builds a three-layer image with zstd, uncompressed
// and mixed layers.
func TestBuildEncodings(t *testing.T) {
	var c imagetest.Image
	for _, img := range imagetest.Corpus() {
		if img.Name == "hardlinks" {
			c = img
		}
	}
	reg := images.StartRegistry(t, nil)
	for name, encs := range map[string][]images.Compression{
		"Zstd":         {images.Zstd},
		"Uncompressed": {images.Uncompressed},
		"Mixed":        {images.Zstd, images.Uncompressed, images.Gzip},
	} {
		t.Run(name, func(t *testing.T) {
			ref := reg.Push(t, "enc/"+strings.ToLower(name)+":v1", corpusImage(t, c.Layers, encs...))
			opts := builderOptions(t, reg.Host)
			res := buildOK(t, newBuilder(t, opts), opts.Store, rootfs.Source{Ref: ref}, len(c.Layers), nil, nil)
			checkWant(t, c.Want(), res.snap)
		})
	}
}

// TestBuildBasicAuth builds from a registry that wants basic auth: the
// right credentials work, wrong or missing ones fail at Resolve with an
// authentication error that never shows the password.
func TestBuildBasicAuth(t *testing.T) {
	const user, pass = "builder", "S3cret-Registry-Pw"
	reg := images.StartRegistry(t, images.BasicAuth(user, pass))
	ref := reg.Push(t, "private/app:v1", corpusImage(t, []imagetest.Layer{{imagetest.File("secret-app", "ok")}}),
		remote.WithAuth(&authn.Basic{Username: user, Password: pass}))
	opts := builderOptions(t, reg.Host)
	b := newBuilder(t, opts)

	t.Run("Good", func(t *testing.T) {
		res := buildOK(t, b, opts.Store, rootfs.Source{Ref: ref, Username: user, Password: pass}, 1, nil, nil)
		checkWant(t, imagetest.Expect(imagetest.WFile("secret-app", 0o644, "ok")), res.snap)
	})
	for name, src := range map[string]rootfs.Source{
		"WrongPassword": {Ref: ref, Username: user, Password: "Wr0ng-Pa55word"},
		"WrongUser":     {Ref: ref, Username: "nobody", Password: pass},
		"None":          {Ref: ref},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := b.Resolve(context.Background(), src)
			if err == nil {
				t.Fatal("Resolve succeeded")
			}
			t.Logf("Resolve: %v", err)
			if !errors.Is(err, oci.ErrUnauthorized) || !strings.Contains(err.Error(), "authentication") {
				t.Errorf("Resolve error = %v, want ErrUnauthorized mentioning authentication", err)
			}
			msg := err.Error()
			for _, secret := range []string{pass, src.Password, base64.StdEncoding.EncodeToString([]byte(src.Username + ":" + src.Password))} {
				if secret != "" && strings.Contains(msg, secret) {
					t.Errorf("Resolve error %q shows a secret %q", msg, secret)
				}
			}
		})
	}
}

// TestBuildDigestMismatch serves wrong bytes (same length) for one layer:
// the build fails with a digest error naming the blob, and neither the
// store nor the cache keeps anything of it.
func TestBuildDigestMismatch(t *testing.T) {
	img := corpusImage(t, []imagetest.Layer{
		{imagetest.Blob("good", 200<<10, 1)},
		{imagetest.Blob("bad", 300<<10, 2)},
	})
	bad := images.LayerDigests(t, img)[1]
	corrupt := images.LayerBlob(t, img, bad)
	corrupt[len(corrupt)/2] ^= 0xff
	reg := images.StartRegistry(t, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if d, ok := images.BlobDigest(req); ok && d == bad.String() && req.Method == http.MethodGet {
				w.Header().Set("Content-Length", strconv.Itoa(len(corrupt)))
				w.Header().Set("Docker-Content-Digest", bad.String())
				w.Write(corrupt)
				return
			}
			next.ServeHTTP(w, req)
		})
	})
	ref := reg.Push(t, "corrupt/app:v1", img)
	opts := builderOptions(t, reg.Host)
	b := newBuilder(t, opts)
	imgR := resolve(t, b, rootfs.Source{Ref: ref})
	art, err := b.Build(context.Background(), specOf(imgR, ref, nil, nil), nil)
	if err == nil {
		t.Fatalf("Build succeeded (%s)", art.Path)
	}
	t.Logf("Build: %v", err)
	if !errors.Is(err, oci.ErrDigestMismatch) || !strings.Contains(err.Error(), "digest") || !strings.Contains(err.Error(), bad.Hex) {
		t.Errorf("Build error = %v, want a digest mismatch naming %s", err, bad)
	}
	checkStoreEmpty(t, opts.Store)
	checkCacheClean(t, opts.Pull.CacheDir, bad)
}

// enospcImage is one file of size bytes: random (incompressible) or a
// repeated phrase (compressing to almost nothing).
func enospcImage(t *testing.T, size int64, random bool) v1.Image {
	e := imagetest.Blob("payload", size, 7)
	if !random {
		e = imagetest.File("payload", strings.Repeat("cube template center fills the disk\n", int(size)/36))
	} else {
		// Blob's generator compresses 2.5:1; crypto noise does not.
		e.Body = make([]byte, size)
		if _, err := io.ReadFull(noise{}, e.Body); err != nil {
			t.Fatal(err)
		}
	}
	return corpusImage(t, []imagetest.Layer{{e}})
}

// noise is a cheap incompressible byte stream.
type noise struct{}

func (noise) Read(p []byte) (int, error) {
	x := uint64(0x9e3779b97f4a7c15)
	for i := range p {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		p[i] = byte(x >> 24)
	}
	return len(p), nil
}

// TestBuildNoSpace builds into a store on a small tmpfs: an image whose
// layers clearly cannot fit fails the preflight, and one that passes the
// preflight but expands past the disk fails with ENOSPC; neither leaves a
// file behind.
func TestBuildNoSpace(t *testing.T) {
	reg := images.StartRegistry(t, nil)
	for _, c := range []struct {
		name, tmpfs string
		size        int64
		random      bool
		want        string
	}{
		{"Preflight", "8m", 12 << 20, true, "insufficient disk space"},
		{"ENOSPC", "80m", 120 << 20, false, "no space left on device"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ref := reg.Push(t, "big/"+strings.ToLower(c.name)+":v1", enospcImage(t, c.size, c.random))
			opts := builderOptions(t, reg.Host)
			opts.Store = rootfs.Store(imagetest.Tmpfs(t, c.tmpfs))
			b := newBuilder(t, opts)
			img := resolve(t, b, rootfs.Source{Ref: ref})
			art, err := b.Build(context.Background(), specOf(img, ref, nil, nil), nil)
			if err == nil {
				t.Fatalf("Build succeeded (%s, %d bytes) on a %s tmpfs", art.Path, art.Size, c.tmpfs)
			}
			t.Logf("Build: %v", err)
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("Build error = %v, want it to mention %q", err, c.want)
			}
			checkStoreEmpty(t, opts.Store)
			checkCacheClean(t, opts.Pull.CacheDir)
		})
	}
}

// buildResult is what a Build running on its own goroutine returned.
type buildResult struct {
	art *rootfs.Artifact
	err error
}

// cancelBound is how soon a cancelled Build must return: cancellation
// takes milliseconds, so this only catches a Build that ignores it.
const cancelBound = 5 * time.Second

// waitBuild waits for a build's result, failing the test if it takes
// longer than cancelBound.
// startBuild runs b.Build in the background; its result arrives on the
// channel returned.
func startBuild(ctx context.Context, b *rootfs.Builder, spec rootfs.Spec, progress rootfs.ProgressFunc) <-chan buildResult {
	done := make(chan buildResult, 1)
	go func() {
		art, err := b.Build(ctx, spec, progress)
		done <- buildResult{art, err}
	}()
	return done
}

// cancelOnce cancels the build behind done once started closes, and
// checks that it returns the context's error in time, leaving nothing in
// the store and no bad blob in the layer cache.
func cancelOnce(t *testing.T, started <-chan struct{}, cancel context.CancelFunc, done <-chan buildResult, opts rootfs.Options, bad v1.Hash) {
	t.Helper()
	select {
	case <-started:
	case r := <-done:
		t.Fatalf("Build returned before the held download: %v", r.err)
	}
	cancel()
	r := waitBuild(t, done)
	t.Logf("Build: %v", r.err)
	if !errors.Is(r.err, context.Canceled) {
		t.Errorf("Build error = %v, want context.Canceled", r.err)
	}
	checkStoreEmpty(t, opts.Store)
	checkCacheClean(t, opts.Pull.CacheDir, bad)
}

func waitBuild(t *testing.T, ch <-chan buildResult) buildResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(cancelBound):
		t.Fatalf("Build did not return within %s of the cancellation", cancelBound)
		return buildResult{}
	}
}

// TestBuildCancel cancels a build while a layer download hangs, and while
// layers are being written into the image: Build returns the context's
// error and leaves nothing behind.
func TestBuildCancel(t *testing.T) {
	t.Run("DuringFetch", func(t *testing.T) {
		img := corpusImage(t, []imagetest.Layer{{imagetest.Blob("a", 100<<10, 1)}, {imagetest.Blob("b", 100<<10, 2)}})
		hang := images.LayerDigests(t, img)[1]
		started := make(chan struct{})
		release := make(chan struct{})
		var once sync.Once
		reg := images.StartRegistry(t, func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
				if d, ok := images.BlobDigest(req); ok && d == hang.String() && req.Method == http.MethodGet {
					once.Do(func() { close(started) })
					select {
					case <-release:
					case <-req.Context().Done():
					}
					return
				}
				next.ServeHTTP(w, req)
			})
		})
		t.Cleanup(func() { close(release) }) // before the server closes
		ref := reg.Push(t, "hang/app:v1", img)
		opts := builderOptions(t, reg.Host)
		b := newBuilder(t, opts)
		imgR := resolve(t, b, rootfs.Source{Ref: ref})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := startBuild(ctx, b, specOf(imgR, ref, nil, nil), nil)
		cancelOnce(t, started, cancel, done, opts, hang)
	})
	t.Run("DuringWrite", func(t *testing.T) {
		reg := images.StartRegistry(t, nil)
		layers := []imagetest.Layer{
			{imagetest.Blob("one", 2<<20, 1)}, {imagetest.Blob("two", 2<<20, 2)}, {imagetest.Blob("three", 2<<20, 3)},
		}
		ref := reg.Push(t, "slow/app:v1", corpusImage(t, layers))
		opts := builderOptions(t, reg.Host)
		b := newBuilder(t, opts)
		img := resolve(t, b, rootfs.Source{Ref: ref})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// Cancel when the first layer is written: the download phase is
		// over (Pull is nil) and the percentage has passed 60.
		var prog progressLog
		prog.hook = func(p rootfs.Progress) {
			if p.Pull == nil && p.Percent > 60 {
				cancel()
			}
		}
		done := startBuild(ctx, b, specOf(img, ref, nil, nil), prog.record)
		r := waitBuild(t, done)
		if ctx.Err() == nil {
			t.Fatalf("no layer progress was reported (Build: %v)", r.err)
		}
		t.Logf("Build: %v", r.err)
		if !errors.Is(r.err, context.Canceled) {
			t.Errorf("Build error = %v, want context.Canceled", r.err)
		}
		checkStoreEmpty(t, opts.Store)
		checkCacheClean(t, opts.Pull.CacheDir)
	})
}

// TestBuildConcurrentSharedLayers runs two builds of images sharing their
// two bottom layers through one Builder. The shared downloads are held
// until both builds are fetching, so the second build meets the first's
// downloads in flight: every blob is still fetched once, and both images
// are right.
func TestBuildConcurrentSharedLayers(t *testing.T) {
	shared := []imagetest.Layer{
		{imagetest.Dir("etc/"), imagetest.File("etc/os", "shared"), imagetest.Blob("usr/lib/big", 2<<20, 11)},
		{imagetest.Blob("usr/bin/tool", 1<<20, 12).Perm(0o755)},
	}
	layersA := append(append([]imagetest.Layer{}, shared...), imagetest.Layer{imagetest.File("app", "A")})
	layersB := append(append([]imagetest.Layer{}, shared...), imagetest.Layer{imagetest.File("app", "B"), imagetest.File("only-b", "b")})
	imgA, imgB := corpusImage(t, layersA), corpusImage(t, layersB)
	dA, dB := images.LayerDigests(t, imgA), images.LayerDigests(t, imgB)
	if dA[0] != dB[0] || dA[1] != dB[1] || dA[2] == dB[2] {
		t.Fatal("the images do not share exactly their two bottom layers")
	}
	sharedSet := map[string]bool{dA[0].String(): true, dA[1].String(): true}
	uniqueSeen := map[string]chan struct{}{dA[2].String(): make(chan struct{}), dB[2].String(): make(chan struct{})}
	var mu sync.Mutex
	overlapped := true
	reg := images.StartRegistry(t, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			d, ok := images.BlobDigest(req)
			if ok && req.Method == http.MethodGet {
				if ch := uniqueSeen[d]; ch != nil {
					mu.Lock()
					select {
					case <-ch:
					default:
						close(ch)
					}
					mu.Unlock()
				}
				if sharedSet[d] {
					for _, ch := range uniqueSeen {
						select {
						case <-ch:
						case <-time.After(20 * time.Second):
							mu.Lock()
							overlapped = false
							mu.Unlock()
						}
					}
				}
			}
			next.ServeHTTP(w, req)
		})
	})
	refA, refB := reg.Push(t, "shared/a:v1", imgA), reg.Push(t, "shared/b:v1", imgB)
	opts := builderOptions(t, reg.Host)
	b := newBuilder(t, opts)
	resA, resB := resolve(t, b, rootfs.Source{Ref: refA}), resolve(t, b, rootfs.Source{Ref: refB})

	var wg sync.WaitGroup
	arts := make([]*rootfs.Artifact, 2)
	errs := make([]error, 2)
	for i, img := range []*rootfs.Image{resA, resB} {
		ref := []string{refA, refB}[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			arts[i], errs[i] = b.Build(context.Background(), specOf(img, ref, nil, nil), nil)
		}()
	}
	wg.Wait()
	if !overlapped {
		t.Error("the two builds never fetched at the same time")
	}
	for _, d := range append(dA, dB[2]) {
		if n := reg.BlobGETs(d); n != 1 {
			t.Errorf("blob %s fetched %d times, want 1", d, n)
		}
	}
	wantShared := []imagetest.PathInfo{
		imagetest.WDir("etc", 0o755), imagetest.WFile("etc/os", 0o644, "shared"),
		imagetest.WDir("usr", 0o755), imagetest.WDir("usr/lib", 0o755), imagetest.WFileOf("usr/lib/big", 0o644, shared[0][2]),
		imagetest.WDir("usr/bin", 0o755), imagetest.WFileOf("usr/bin/tool", 0o755, shared[1][0]),
	}
	wants := []imagetest.Snapshot{
		imagetest.Expect(append(wantShared, imagetest.WFile("app", 0o644, "A"))...),
		imagetest.Expect(append(wantShared, imagetest.WFile("app", 0o644, "B"), imagetest.WFile("only-b", 0o644, "b"))...),
	}
	for i, art := range arts {
		if errs[i] != nil {
			t.Errorf("Build %d: %v", i, errs[i])
			continue
		}
		imagetest.Fsck(t, art.Path)
		got, err := imagetest.SnapshotDir(imagetest.Mount(t, art.Path))
		if err != nil {
			t.Fatal(err)
		}
		checkWant(t, wants[i], got)
	}
}

// TestBuildInjection installs envd and bakes the CA into an image with a
// Debian-style trust store and an old envd, and into a scratch image
// (where the CA seeds a new bundle), checking through the mount.
func TestBuildInjection(t *testing.T) {
	reg := images.StartRegistry(t, nil)
	caPEM, caFile := newCA(t, "Cube Egress Test Root")
	oldPEM, _ := newCA(t, "Some Public Root")
	oldBundle := string(oldPEM)
	envd := fakeEnvd(3)

	debianish := []imagetest.Layer{{
		imagetest.Dir("etc/"), imagetest.Dir("etc/ssl/"), imagetest.Dir("etc/ssl/certs/"),
		imagetest.File("etc/ssl/certs/ca-certificates.crt", oldBundle).Perm(0o444).Owner(0, 0),
		imagetest.Dir("usr/"), imagetest.Dir("usr/local/"), imagetest.Dir("usr/local/share/"),
		imagetest.Dir("usr/local/share/ca-certificates/").Perm(0o755),
		imagetest.Dir("usr/local/bin/").Perm(0o700).Owner(1000, 1000),
		imagetest.File("usr/local/bin/envd", "old envd").Perm(0o600).Owner(1000, 1000).Xattr("user.old", "1"),
		imagetest.File("usr/local/bin/other", "other"),
	}}
	scratch := []imagetest.Layer{{imagetest.File("hello", "hi")}}

	for _, c := range []struct {
		name    string
		layers  []imagetest.Layer
		targets int
		want    []imagetest.PathInfo
	}{
		{"DebianStyle", debianish, 2, []imagetest.PathInfo{
			imagetest.WFile("etc/ssl/certs/ca-certificates.crt", 0o444, oldBundle+string(caPEM)),
			imagetest.WFile("usr/local/share/ca-certificates/cube-egress-root.crt", 0o644, string(caPEM)),
			imagetest.WDir("usr/local/bin", 0o700).Owner(1000, 1000),
			imagetest.WFile("usr/local/bin/envd", 0o755, string(envd)).At(imageCreated),
			imagetest.WFile("usr/local/bin/other", 0o644, "other"),
		}},
		{"Scratch", scratch, 1, []imagetest.PathInfo{
			imagetest.WFile("hello", 0o644, "hi"),
			imagetest.WDir("etc", 0o755), imagetest.WDir("etc/ssl", 0o755), imagetest.WDir("etc/ssl/certs", 0o755),
			imagetest.WFile("etc/ssl/certs/ca-certificates.crt", 0o644, string(caPEM)),
			imagetest.WDir("usr", 0o755), imagetest.WDir("usr/local", 0o755), imagetest.WDir("usr/local/bin", 0o755),
			imagetest.WFile("usr/local/bin/envd", 0o755, string(envd)).At(imageCreated),
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ref := reg.Push(t, "inject/"+strings.ToLower(c.name)+":v1", corpusImage(t, c.layers))
			opts := builderOptions(t, reg.Host)
			opts.CAPath = caFile
			b := newBuilder(t, opts)
			ca, err := b.LoadCA(context.Background())
			if err != nil {
				t.Fatalf("LoadCA: %v", err)
			}
			if !bytes.Equal(ca.PEM, caPEM) {
				t.Errorf("LoadCA PEM = %q, want the file's", ca.PEM)
			}
			res := buildOK(t, b, opts.Store, rootfs.Source{Ref: ref}, len(c.layers), envd, ca)
			if !res.art.CABaked || res.art.CATargets != c.targets {
				t.Errorf("CABaked, CATargets = %v, %d; want true, %d", res.art.CABaked, res.art.CATargets, c.targets)
			}
			// Only the listed paths and their unlisted parents are compared.
			want := imagetest.Expect(c.want...)
			got := imagetest.Snapshot{}
			for p, info := range res.snap {
				if _, ok := want[p]; ok {
					got[p] = info
				}
			}
			checkWant(t, want, got)
			// The rest of the image: every listed path exists, nothing else
			// was added but the directories of the injected files.
			for p := range res.snap {
				if _, ok := want[p]; !ok && p != "." && p != imagetest.LostFound && !declaredIn(c.layers, p) {
					t.Errorf("unexpected path %q in the image", p)
				}
			}
			envdInfo, err := inspectStat(res.art.Path, "/usr/local/bin/envd")
			if err != nil || envdInfo.UID != 0 || envdInfo.GID != 0 || envdInfo.Mode.Perm() != 0o755 || !envdInfo.Mode.IsRegular() {
				t.Errorf("inspect envd = %+v, %v; want a 0755 root:root file", envdInfo, err)
			}
		})
	}

	t.Run("BadCA", func(t *testing.T) {
		opts := builderOptions(t, reg.Host)
		opts.CAPath = filepath.Join(t.TempDir(), "not-a-ca.crt")
		os.WriteFile(opts.CAPath, []byte("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"), 0o644)
		if _, err := newBuilder(t, opts).LoadCA(context.Background()); err == nil || !strings.Contains(err.Error(), opts.CAPath) {
			t.Errorf("LoadCA of garbage = %v, want an error naming the file", err)
		}
	})
}

// declaredIn reports whether some layer has an entry at p.
func declaredIn(layers []imagetest.Layer, p string) bool {
	for _, l := range layers {
		for _, e := range l {
			if strings.TrimSuffix(e.Name, "/") == p {
				return true
			}
		}
	}
	return false
}

// inspectStat reads one path's metadata through go-diskfs.
func inspectStat(imagePath, p string) (inspect.Entry, error) {
	im, err := inspect.Open(imagePath)
	if err != nil {
		return inspect.Entry{}, err
	}
	defer im.Close()
	return im.Stat(p)
}
