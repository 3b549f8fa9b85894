package oci

import (
	"context"
	"testing"
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
