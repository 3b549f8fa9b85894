package oci

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// benchImage pushes an image of 4 random layers of 8 MiB to an in-memory
// registry on loopback.
func benchImage(b *testing.B) (*testRegistry, Source, int64) {
	b.Helper()
	reg := newTestRegistry(b, nil)
	img := testImage(b, 4, 8<<20)
	push(b, reg.host+"/bench:v1", img)
	return reg, Source{Ref: reg.host + "/bench:v1"}, imageSize(b, img)
}

func benchFetch(b *testing.B, p *Puller, src Source) {
	b.Helper()
	ctx := context.Background()
	img, err := p.Resolve(ctx, src)
	if err != nil {
		b.Fatal(err)
	}
	ls, err := p.Fetch(ctx, img, nil)
	if err != nil {
		b.Fatal(err)
	}
	ls.Close()
}

// BenchmarkFetchCold downloads every layer into an empty cache.
func BenchmarkFetchCold(b *testing.B) {
	_, src, size := benchImage(b)
	b.SetBytes(size)
	for b.Loop() {
		b.StopTimer()
		p, err := New(testOptions(b.TempDir()))
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		benchFetch(b, p, src)
		b.StopTimer()
		p.Close()
		b.StartTimer()
	}
}

// BenchmarkFetchWarm resolves and fetches an image whose layers this
// process has already verified: only the manifest and config cross the
// network.
func BenchmarkFetchWarm(b *testing.B) {
	_, src, size := benchImage(b)
	p := newTestPuller(b, Options{})
	benchFetch(b, p, src)
	b.SetBytes(size)
	for b.Loop() {
		benchFetch(b, p, src)
	}
}

// BenchmarkFetchWarmRestart fetches from a cache filled by an earlier
// process: each layer is hashed once to verify it.
func BenchmarkFetchWarmRestart(b *testing.B) {
	_, src, size := benchImage(b)
	dir := b.TempDir()
	p, err := New(testOptions(dir))
	if err != nil {
		b.Fatal(err)
	}
	benchFetch(b, p, src)
	p.Close()
	b.SetBytes(size)
	for b.Loop() {
		p, err := New(testOptions(dir))
		if err != nil {
			b.Fatal(err)
		}
		benchFetch(b, p, src)
		p.Close()
	}
}

// BenchmarkFetchLink fetches an image of the Debian benchmark image's
// shape (93 MB compressed: 68, 15 and 10 MB layers) into an empty cache
// through a modelled link: one shared bandwidth, 20 ms before each new
// connection's first answer, and, in the capped rows, each connection at
// most 200 Mbit/s as behind a CDN or object store. x-floor is the time
// over the link floor (the bytes at the shared bandwidth). conns=1 reads
// one body at a time, as the fetch did before parallel chunks.
func BenchmarkFetchLink(b *testing.B) {
	sizes := []int{68e6, 15e6, 10e6}
	img := empty.Image
	blobs := make(map[string][]byte)
	var total int64
	rnd := rand.New(rand.NewPCG(7, 7))
	for _, n := range sizes {
		blob := make([]byte, n)
		for i := 0; i < n; i += 8 {
			binary.LittleEndian.PutUint64(blob[i:], rnd.Uint64())
		}
		l := static.NewLayer(blob, types.DockerLayer)
		d, err := l.Digest()
		if err != nil {
			b.Fatal(err)
		}
		blobs[d.String()] = blob
		total += int64(n)
		if img, err = mutate.AppendLayers(img, l); err != nil {
			b.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name          string
		shared, perCn int64 // bytes per second
	}{
		{"1Gbit-200Mbit-per-conn", 125e6, 25e6},
		{"1Gbit", 125e6, 0},
		{"400Mbit", 50e6, 0},
	} {
		for _, conns := range []int{1, 0} {
			b.Run(fmt.Sprintf("%s/conns=%d", tc.name, conns), func(b *testing.B) {
				link := newLinkModel(tc.perCn, tc.shared, 20*time.Millisecond)
				link.blobs = blobs
				reg := newTestRegistry(b, link.wrap)
				push(b, reg.host+"/bench:v1", img)
				src := Source{Ref: reg.host + "/bench:v1"}
				floor := float64(total) / float64(tc.shared)
				b.SetBytes(total)
				var took time.Duration
				for b.Loop() {
					b.StopTimer()
					opts := testOptions(b.TempDir())
					opts.DownloadConnections = conns
					p, err := New(opts)
					if err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					began := time.Now()
					benchFetch(b, p, src)
					took += time.Since(began)
					b.StopTimer()
					p.Close()
					b.StartTimer()
				}
				b.ReportMetric(took.Seconds()/float64(b.N)/floor, "x-floor")
			})
		}
	}
}
