package flatten_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/flatten"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/fstest"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/layercodec"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// benchLayer is about 200 MB of files sized like a distribution's: many
// small ones, some large, in a few hundred directories.
func benchLayer(b *testing.B) []byte {
	b.Helper()
	sizes := []int64{300, 2 << 10, 9 << 10, 40 << 10, 150 << 10, 700 << 10, 3 << 20}
	var l imagetest.Layer
	var total int64
	for i := 0; total < 200<<20; i++ {
		if i%16 == 0 {
			l = append(l, imagetest.Dir(fmt.Sprintf("d%03d/", i/16)))
		}
		size := sizes[i%len(sizes)]
		l = append(l, imagetest.Blob(fmt.Sprintf("d%03d/f%05d", i/16, i), size, uint64(i)))
		total += size
	}
	raw, err := l.Tar()
	if err != nil {
		b.Fatal(err)
	}
	return raw
}

// BenchmarkApplyLayer measures ApplyLayer (decompression included) on a
// 200 MB layer, into a store that drops the data and into the real ext4
// writer. Throughput is in uncompressed bytes.
func BenchmarkApplyLayer(b *testing.B) {
	raw := benchLayer(b)
	for _, enc := range []images.Compression{images.Uncompressed, images.Gzip} {
		blob, err := enc.Encode(raw)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("%s/discard", enc), func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				applyBlob(b, flatten.New(&fstest.DiscardStore{}, flatten.Options{}), blob, false)
			}
		})
		for _, ahead := range []bool{false, true} {
			name := fmt.Sprintf("%s/ext4", enc)
			if ahead {
				name += "-readahead"
			}
			b.Run(name, func(b *testing.B) {
				b.SetBytes(int64(len(raw)))
				dir := b.TempDir()
				for i := 0; b.Loop(); i++ {
					b.StopTimer()
					path := filepath.Join(dir, fmt.Sprintf("bench%d.ext4", i))
					f, err := os.Create(path)
					if err != nil {
						b.Fatal(err)
					}
					w, err := ext4.NewWriter(f, ext4Options())
					if err != nil {
						b.Fatal(err)
					}
					tree := flatten.New(w, flatten.Options{})
					b.StartTimer()
					applyBlob(b, tree, blob, ahead)
					b.StopTimer()
					if _, err := w.Finish(context.Background(), tree.Root()); err != nil {
						b.Fatal(err)
					}
					f.Close()
					os.Remove(path)
					b.StartTimer()
				}
			})
		}
	}
}

func applyBlob(b *testing.B, tree *flatten.Tree, blob []byte, ahead bool) {
	rc, err := layercodec.Decompress(bytes.NewReader(blob), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer rc.Close()
	var r io.Reader = rc
	if ahead {
		ra := layercodec.ReadAheadSize(rc, 4<<20, nil)
		defer ra.Close()
		r = ra
	}
	if err := tree.ApplyLayer(context.Background(), 0, r); err != nil {
		b.Fatal(err)
	}
}
