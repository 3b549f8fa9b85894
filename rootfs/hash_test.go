package rootfs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/layercodec"
)

// TestDirectData pins which images the Builder writes with direct I/O.
func TestDirectData(t *testing.T) {
	for _, c := range []struct {
		compressed int64
		want       bool
	}{{0, false}, {91 << 20, false}, {directMinCompressed - 1, false}, {directMinCompressed, true}, {195 << 20, true}} {
		if got := directData(c.compressed); got != c.want {
			t.Errorf("directData(%d) = %v, want %v", c.compressed, got, c.want)
		}
	}
}

// TestFileSHA256 checks both ways of reading the file, direct and through
// the page cache, on sizes around the read and block sizes.
func TestFileSHA256(t *testing.T) {
	dir := t.TempDir()
	pool := new(layercodec.ChunkPool) // page-aligned buffers, as the Builder's
	r := rand.New(rand.NewPCG(3, 4))
	for _, size := range []int{0, 1, 4095, 4096, hashBufSize, hashBufSize + 123, 2*hashBufSize + 4096} {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		p := filepath.Join(dir, "f")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		want := hex.EncodeToString(sum[:])
		direct, ok, err := directSHA256(context.Background(), p, pool)
		if !ok || err != nil || direct != want {
			t.Errorf("%d bytes: direct read gives %q, %v, %v; want %s (does the test's file system refuse O_DIRECT?)", size, direct, ok, err, want)
		}
		if got, err := FileSHA256(context.Background(), p); err != nil || got != want {
			t.Errorf("%d bytes: FileSHA256 = %q, %v; want %s", size, got, err, want)
		}
		for _, direct := range []bool{false, true} {
			if got, err := hashImage(context.Background(), p, direct, pool); err != nil || got != want {
				t.Errorf("%d bytes: hashImage(direct %v) = %q, %v; want %s", size, direct, got, err, want)
			}
		}
	}
	if _, err := FileSHA256(context.Background(), filepath.Join(dir, "missing")); err == nil {
		t.Error("FileSHA256 of a missing file: no error")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := directSHA256(ctx, filepath.Join(dir, "f"), pool); err == nil {
		t.Error("directSHA256 with a cancelled context: no error")
	}
}
