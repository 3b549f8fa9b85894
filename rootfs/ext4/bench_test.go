package ext4

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
)

// repeatReader yields n bytes cycling over a random block pattern.
type repeatReader struct {
	pat []byte
	n   int64
	off int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > r.n {
		p = p[:r.n]
	}
	k := 0
	for k < len(p) {
		c := copy(p[k:], r.pat[r.off:])
		k += c
		r.off = (r.off + c) % len(r.pat)
	}
	r.n -= int64(k)
	return k, nil
}

const benchBytes = 512 << 20

var benchPattern = randBytes(42, 4<<20+4096*3)

// onScratchFile runs write b.N times, each on a fresh file in dir that is
// closed and removed afterwards.
func onScratchFile(b *testing.B, dir string, write func(f *os.File) error) {
	b.Helper()
	for i := 0; i < b.N; i++ {
		p := filepath.Join(dir, "scratch")
		f, err := os.Create(p)
		if err != nil {
			b.Fatal(err)
		}
		if err := write(f); err != nil {
			b.Fatal(err)
		}
		f.Close()
		os.Remove(p)
	}
}

// BenchmarkWriteData compares WriteData with a plain sequential write of
// the same bytes to a file on the same disk (both end with fsync).
func BenchmarkWriteData(b *testing.B) {
	dir := b.TempDir()
	b.Run("Writer", func(b *testing.B) {
		b.SetBytes(benchBytes)
		onScratchFile(b, dir, func(f *os.File) error {
			w, err := NewWriter(f, testOptions())
			if err != nil {
				return err
			}
			if _, err := w.WriteData(context.Background(), &repeatReader{pat: benchPattern, n: benchBytes}, benchBytes); err != nil {
				return err
			}
			return f.Sync()
		})
	})
	b.Run("SmallFiles", func(b *testing.B) {
		// 32 KiB files, as in a typical root filesystem.
		const fileSize = 32 << 10
		b.SetBytes(benchBytes)
		onScratchFile(b, dir, func(f *os.File) error {
			w, err := NewWriter(f, testOptions())
			if err != nil {
				return err
			}
			r := &repeatReader{pat: benchPattern, n: benchBytes}
			for k := 0; k < benchBytes/fileSize; k++ {
				if _, err := w.WriteData(context.Background(), r, fileSize); err != nil {
					return err
				}
			}
			return f.Sync()
		})
	})
	b.Run("PlainFile", func(b *testing.B) {
		b.SetBytes(benchBytes)
		buf := make([]byte, ioBufSize)
		onScratchFile(b, dir, func(f *os.File) error {
			if _, err := io.CopyBuffer(onlyWriter{f}, &repeatReader{pat: benchPattern, n: benchBytes}, buf); err != nil {
				return err
			}
			return f.Sync()
		})
	})
}

// onlyWriter hides os.File's ReadFrom so the copy is a plain write loop.
type onlyWriter struct{ w io.Writer }

func (o onlyWriter) Write(p []byte) (int, error) { return o.w.Write(p) }

// benchTree builds 100,000 one-block files in 1,000 directories. Their
// Data points at made-up blocks: Finish only lays out metadata around
// them, so the content itself is not needed.
func benchTree(w *Writer) *Node {
	root := dir(map[string]*Node{})
	for d := 0; d < 1000; d++ {
		sub := dir(map[string]*Node{})
		for f := 0; f < 100; f++ {
			var data Data
			runs, _ := w.alloc.alloc(1)
			data.addRun(0, runs[0].start, 1)
			sub.Children[fmt.Sprintf("file-%03d.so", f)] = &Node{Mode: ModeRegular | 0o644, Size: 1000, Data: data, Mtime: Nanos(testTime)}
		}
		root.Children[fmt.Sprintf("dir-%04d", d)] = sub
	}
	return root
}

// BenchmarkFinish100kFiles measures Finish for 100,000 small files.
func BenchmarkFinish100kFiles(b *testing.B) {
	dir := b.TempDir()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		p := filepath.Join(dir, "f.ext4")
		f, err := os.Create(p)
		if err != nil {
			b.Fatal(err)
		}
		w, err := openWriter(f, testOptions())
		if err != nil {
			b.Fatal(err)
		}
		root := benchTree(w)
		b.StartTimer()
		if _, err := w.Finish(context.Background(), root); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		f.Close()
		os.Remove(p)
		b.StartTimer()
	}
}

// TestBenchTreeIsClean keeps the benchmark's image honest.
func TestBenchTreeIsClean(t *testing.T) {
	if testing.Short() {
		t.Skip("100,000 inodes")
	}
	im := newImage(t, testOptions())
	im.finish(benchTree(im.w))
	imagetest.Fsck(t, im.path)
}

// gzipStream returns a gzip stream of n bytes of semi-compressible data
// (random hex text), built once per size.
func gzipStream(b *testing.B, n int) []byte {
	b.Helper()
	raw := make([]byte, 0, n)
	src := randBytes(5, n/2+1)
	const hexdigits = "0123456789abcdef"
	for i := 0; len(raw) < n; i++ {
		raw = append(raw, hexdigits[src[i]>>4], hexdigits[src[i]&15])
	}
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if _, err := zw.Write(raw[:n]); err != nil {
		b.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}

// BenchmarkWriteDataFromGzip feeds WriteData and a plain file write from
// the same gzip stream, as the layer pipeline does: WriteData's
// asynchronous writes overlap decompression with writing.
func BenchmarkWriteDataFromGzip(b *testing.B) {
	const n = 256 << 20
	gz := gzipStream(b, n)
	dir := b.TempDir()
	b.Run("Writer", func(b *testing.B) {
		b.SetBytes(n)
		onScratchFile(b, dir, func(f *os.File) error {
			w, err := NewWriter(f, testOptions())
			if err != nil {
				return err
			}
			zr, err := gzip.NewReader(bytes.NewReader(gz))
			if err != nil {
				return err
			}
			if _, err := w.WriteData(context.Background(), zr, n); err != nil {
				return err
			}
			_, err = w.Finish(context.Background(), &Node{Mode: ModeDir | 0o755})
			return err
		})
	})
	b.Run("PlainFile", func(b *testing.B) {
		b.SetBytes(n)
		buf := make([]byte, ioBufSize)
		onScratchFile(b, dir, func(f *os.File) error {
			zr, err := gzip.NewReader(bytes.NewReader(gz))
			if err != nil {
				return err
			}
			if _, err := io.CopyBuffer(onlyWriter{f}, zr, buf); err != nil {
				return err
			}
			return f.Sync()
		})
	})
}
