package bench

// Micro-benchmarks of the build's hot paths that other packages do not
// cover already. Those that do exist:
//   - rootfs/ext4 BenchmarkWriteData: the ext4 writer next to a plain
//     sequential write of the same bytes on the same disk, and
//     BenchmarkWriteDataFromGzip, BenchmarkFinish100kFiles;
//   - rootfs/flatten BenchmarkApplyLayer: flattening a 200 MB layer, plain
//     and gzip, into a discarding store and into the ext4 writer;
//   - rootfs/oci BenchmarkFetchCold/Warm/WarmRestart: the layer cache.
//
// Run: go test -run '^$' -bench . -benchtime 3x ./bench/
// Profile a build: go test -run '^$' -bench '^BenchmarkBuilder$/^debian$/^warm$' -benchtime 5x -cpuprofile cpu.out ./bench/ -args -images /var/tmp/cube-templatecenter-bench/images

import (
	"archive/tar"
	"bytes"
	stdgzip "compress/gzip"
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
	"github.com/cubesandbox/cubetemplatecenter/test/linkproxy"
)

// imagesDir, when set, is where BenchmarkBuilder finds (or makes and keeps)
// the generated images, e.g. tcbench's WORK/images, so that a CPU profile
// shows builds rather than image generation.
var imagesDir = flag.String("images", "", "directory of generated images to reuse (default: a temporary one)")

// mixedTar is a 64 MiB tar of mixedData's four content kinds.
func mixedTar(b *testing.B) []byte {
	b.Helper()
	var buf bytes.Buffer
	tw := &countingTar{Writer: tar.NewWriter(&buf)}
	if err := mixedData(tw, "data", 64<<20, 7); err != nil {
		b.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}

// BenchmarkDecompress inflates the same tar stream with the standard
// library's gzip, klauspost/compress's gzip and zstd. Throughput is in
// uncompressed bytes.
func BenchmarkDecompress(b *testing.B) {
	raw := mixedTar(b)
	var gz, zs bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(raw)
	zw.Close()
	enc, err := zstd.NewWriter(&zs)
	if err != nil {
		b.Fatal(err)
	}
	enc.Write(raw)
	enc.Close()
	b.Logf("tar %d bytes, gzip %d, zstd %d", len(raw), gz.Len(), zs.Len())
	cases := []struct {
		name string
		open func(io.Reader) (io.Reader, error)
		blob []byte
	}{
		{"gzip-stdlib", func(r io.Reader) (io.Reader, error) { return stdgzip.NewReader(r) }, gz.Bytes()},
		{"gzip-klauspost", func(r io.Reader) (io.Reader, error) { return gzip.NewReader(r) }, gz.Bytes()},
		{"zstd-klauspost", func(r io.Reader) (io.Reader, error) {
			d, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true))
			return d, err
		}, zs.Bytes()},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				r, err := c.open(bytes.NewReader(c.blob))
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, r)
				if err != nil || n != int64(len(raw)) {
					b.Fatalf("inflated %d bytes, %v; want %d", n, err, len(raw))
				}
			}
		})
	}
}

// BenchmarkSHA256 hashes 256 MiB from memory, and a 256 MiB file from the
// page cache through reads of different sizes (io.Copy's default buffer is
// 32 KiB; upstream reads 4 MiB).
func BenchmarkSHA256(b *testing.B) {
	buf := make([]byte, 256<<20)
	_, c := newRand(9)
	c.Read(buf)
	b.Run("memory", func(b *testing.B) {
		b.SetBytes(int64(len(buf)))
		for b.Loop() {
			sha256.Sum256(buf)
		}
	})
	path := filepath.Join(b.TempDir(), "blob")
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		b.Fatal(err)
	}
	for _, size := range []int{32 << 10, 1 << 20, 4 << 20} {
		b.Run(fmt.Sprintf("file-read-%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(buf)))
			chunk := make([]byte, size)
			for b.Loop() {
				f, err := os.Open(path)
				if err != nil {
					b.Fatal(err)
				}
				h := sha256.New()
				if _, err := io.CopyBuffer(h, struct{ io.Reader }{f}, chunk); err != nil {
					b.Fatal(err)
				}
				f.Close()
			}
		})
	}
}

// builderFixture is an image in an in-memory registry and a CA file.
type builderFixture struct {
	ref    string
	host   string
	caPath string
	size   int64 // uncompressed bytes
}

func newBuilderFixture(b *testing.B, img *benchImage) builderFixture {
	b.Helper()
	reg := images.StartRegistry(b, nil)
	v1img, err := img.v1Image()
	if err != nil {
		b.Fatal(err)
	}
	ref := reg.Ref("bench/" + img.Name + ":1")
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		b.Fatal(err)
	}
	if err := remote.Write(r, v1img); err != nil {
		b.Fatal(err)
	}
	caPath := filepath.Join(b.TempDir(), "ca.crt")
	if _, err := writeCA(caPath); err != nil {
		b.Fatal(err)
	}
	return builderFixture{ref: ref, host: reg.Host, caPath: caPath, size: img.uncompressed()}
}

// phases are the wall times of one build's parts, taken from Build's
// progress reports: resolve (manifest and config), fetch (until the
// download phase's final report), layers (until the last layer's report)
// and finish (metadata, fsync, hash, publish).
type phases struct{ resolve, fetch, layers, finish float64 }

// build runs one Builder.Build of the fixture's image as artifact id.
func (f builderFixture) build(b *testing.B, bld *rootfs.Builder, id string) phases {
	b.Helper()
	ctx := context.Background()
	began := time.Now()
	img, err := bld.Resolve(ctx, rootfs.Source{Ref: f.ref})
	if err != nil {
		b.Fatal(err)
	}
	ca, err := bld.LoadCA(ctx)
	if err != nil {
		b.Fatal(err)
	}
	resolved := time.Now()
	fetched, layered := resolved, resolved
	fp := fmt.Sprintf("%064x", len(id)) + id
	progress := func(p rootfs.Progress) {
		switch {
		case p.Pull != nil && p.Pull.Done():
			fetched, layered = time.Now(), time.Now()
		case p.Pull == nil:
			layered = time.Now()
		}
	}
	if _, err := bld.Build(ctx, rootfs.Spec{Image: img, ArtifactID: id, Fingerprint: fp, CA: ca,
		Envd: envdBlob("builder", 0, id)}, progress); err != nil {
		b.Fatal(err)
	}
	end := time.Now()
	return phases{resolve: resolved.Sub(began).Seconds(), fetch: fetched.Sub(resolved).Seconds(),
		layers: layered.Sub(fetched).Seconds(), finish: end.Sub(layered).Seconds()}
}

// report adds the mean phase times of the b.N builds as metrics.
func (p phases) report(b *testing.B) {
	n := float64(b.N)
	b.ReportMetric(p.resolve/n, "resolve-s/op")
	b.ReportMetric(p.fetch/n, "fetch-s/op")
	b.ReportMetric(p.layers/n, "layers-s/op")
	b.ReportMetric(p.finish/n, "finish-s/op")
}

func (p *phases) add(q phases) {
	p.resolve += q.resolve
	p.fetch += q.fetch
	p.layers += q.layers
	p.finish += q.finish
}

// coldBuilds builds the fixture's image with an empty layer cache each
// time, artifacts named prefix-<i>, and reports the phases.
func (f builderFixture) coldBuilds(b *testing.B, prefix string) {
	b.SetBytes(f.size)
	store := b.TempDir()
	var sum phases
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("%s-%d", prefix, i)
		bld := f.newBuilder(b, store, filepath.Join(b.TempDir(), "layers"), true)
		sum.add(f.build(b, bld, id))
		b.StopTimer()
		bld.Close()
		os.RemoveAll(filepath.Join(store, id))
		b.StartTimer()
	}
	sum.report(b)
}

func (f builderFixture) newBuilder(b *testing.B, store, cache string, zstd bool) *rootfs.Builder {
	b.Helper()
	bld, err := rootfs.NewBuilder(rootfs.Options{Store: rootfs.Store(store), CAPath: f.caPath,
		HeadroomPercent: 10, HeadroomInodes: 4096, DirectIO: true, // as the agent's default
		Pull: rootfs.PullOptions{CacheDir: cache, Insecure: []string{f.host}, TranscodeZstd: zstd}})
	if err != nil {
		b.Fatal(err)
	}
	return bld
}

// BenchmarkBuilder runs rootfs.Builder end to end (resolve, fetch, flatten,
// inject, ext4, hash, publish) on the Debian image, the large image (Debian
// plus 300 MiB of mixed data), both re-encoded as zstd, and a 128 MiB
// image of mixed data: cold
// (empty layer cache) and warm (layers cached, verified and re-encoded as
// zstd as the agent's cache does, a new artifact each time), with the phase
// breakdown as extra metrics. Throughput is in
// uncompressed layer bytes. The Debian and large images need root
// (debootstrap).
func BenchmarkBuilder(b *testing.B) {
	dir := b.TempDir()
	genDir := filepath.Join(dir, "images")
	if *imagesDir != "" {
		genDir = *imagesDir
	}
	fixtures := map[string]func() *benchImage{
		"debian": func() *benchImage {
			if os.Geteuid() != 0 {
				b.Skip("the Debian image needs root (debootstrap)")
			}
			img, err := prepareImage(context.Background(), ImageDebian, genDir, io.Discard)
			if err != nil {
				b.Fatal(err)
			}
			return img
		},
		"large": func() *benchImage {
			if os.Geteuid() != 0 {
				b.Skip("the large image needs root (debootstrap)")
			}
			img, err := prepareImage(context.Background(), ImageLarge, genDir, io.Discard)
			if err != nil {
				b.Fatal(err)
			}
			return img
		},
		"mixed": func() *benchImage {
			l, err := writeLayer(filepath.Join(dir, "mixed.tar.gz"), func(tw *countingTar) error {
				return mixedData(tw, "opt/data", 128<<20, 5)
			})
			if err != nil {
				b.Fatal(err)
			}
			return &benchImage{Name: "mixed", Layers: []*layerFile{l}}
		},
	}
	// name-zstd is image name with every layer re-encoded as zstd: what a
	// build costs when gzip decompression stops being the floor.
	fixture := func(name string) *benchImage {
		base, isZstd := strings.CutSuffix(name, "-zstd")
		img := fixtures[base]()
		if !isZstd {
			return img
		}
		z := &benchImage{Name: name}
		for i, l := range img.Layers {
			zl, err := transcodeZstd(l, filepath.Join(dir, fmt.Sprintf("%s-%d.tar.zst", name, i)))
			if err != nil {
				b.Fatal(err)
			}
			z.Layers = append(z.Layers, zl)
		}
		return z
	}
	for _, imgName := range []string{"debian", "debian-zstd", "large", "large-zstd", "mixed"} {
		b.Run(imgName, func(b *testing.B) {
			f := newBuilderFixture(b, fixture(imgName))
			b.Run("cold", func(b *testing.B) { f.coldBuilds(b, "rfs-cold") })
			// cold-link: the same through the link model at 400 Mbit/s
			// and 20 ms per connection; fetch-s/op ends at the last
			// byte, so finish-s/op is what the build adds after it.
			b.Run("cold-link400", func(b *testing.B) {
				proxy, err := linkproxy.New(linkproxy.Options{Target: "http://" + f.host,
					BitsPerSecond: 400_000_000, ConnDelay: 20 * time.Millisecond})
				if err != nil {
					b.Fatal(err)
				}
				defer proxy.Close()
				lf := f
				lf.host, lf.ref = proxy.Addr(), strings.Replace(f.ref, f.host, proxy.Addr(), 1)
				lf.coldBuilds(b, "rfs-link")
			})
			for _, mode := range []struct {
				name string
				zstd bool
			}{{"warm", true}, {"warm-gzip", false}} {
				b.Run(mode.name, func(b *testing.B) {
					b.SetBytes(f.size)
					store := b.TempDir()
					bld := f.newBuilder(b, store, filepath.Join(b.TempDir(), "layers"), mode.zstd)
					defer bld.Close()
					f.build(b, bld, "rfs-warmup")
					// As the agent between builds: the cache re-encodes the
					// new gzip layers as zstd in the background.
					for bld.CacheStats().TranscodePending > 0 {
						time.Sleep(10 * time.Millisecond)
					}
					var sum phases
					for i := 0; b.Loop(); i++ {
						sum.add(f.build(b, bld, fmt.Sprintf("rfs-warm-%d", i)))
						b.StopTimer()
						os.RemoveAll(filepath.Join(store, fmt.Sprintf("rfs-warm-%d", i)))
						b.StartTimer()
					}
					sum.report(b)
				})
			}
		})
	}
}
