package layercodec

import (
	"archive/tar"
	"bytes"
	stdgzip "compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/iotest"

	"github.com/klauspost/compress/gzip"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// expectISALEnv, set to 1 (make test does, after make deps installed
// libisal2), makes a missing libisal a test failure rather than a run of
// the pure-Go inflater alone. It is inflatetest.ExpectISALEnv, which this
// package's internal tests cannot import.
const expectISALEnv = "TC_EXPECT_ISAL"

var testISAL = sync.OnceValues(func() (*isalLib, error) { return loadISAL(isalLibName) })

// inflaters are the inflaters under test: always the pure-Go one, and
// ISA-L when libisal loads (it must when TC_EXPECT_ISAL=1).
func inflaters(tb testing.TB) []*GzipInflater {
	tb.Helper()
	all := []*GzipInflater{{backend: BackendGo}}
	lib, err := testISAL()
	switch {
	case err == nil:
		all = append(all, &GzipInflater{backend: BackendISAL, lib: lib})
	case os.Getenv(expectISALEnv) == "1":
		tb.Fatalf("%s=1 but ISA-L does not load: %v", expectISALEnv, err)
	default:
		tb.Logf("only the pure-Go inflater is tested: %v", err)
	}
	return all
}

func gzipOf(tb testing.TB, data []byte, level int, hdr gzip.Header) []byte {
	tb.Helper()
	var b bytes.Buffer
	zw, err := gzip.NewWriterLevel(&b, level)
	if err != nil {
		tb.Fatal(err)
	}
	zw.Header = hdr
	if _, err := zw.Write(data); err != nil {
		tb.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		tb.Fatal(err)
	}
	return b.Bytes()
}

func randomBytes(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed))
	for i := 0; i+8 <= n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b
}

func textBytes(n int, seed uint64) []byte {
	words := strings.Fields("the quick brown fox jumps over a lazy dog layer tar rootfs ext4 image gzip inflate usr lib bin etc")
	r := rand.New(rand.NewPCG(seed, seed))
	var b bytes.Buffer
	for b.Len() < n {
		b.WriteString(words[r.IntN(len(words))])
		if r.IntN(12) == 0 {
			b.WriteByte('\n')
		} else {
			b.WriteByte(' ')
		}
	}
	return b.Bytes()[:n]
}

// readAll reads zr to its end in reads of size n (0: io.ReadAll), and
// scribbles over the caller's buffer after each read, so an inflater that
// kept history in it would show.
func readAll(zr io.Reader, n int) ([]byte, error) {
	if n == 0 {
		return io.ReadAll(zr)
	}
	var out []byte
	p := make([]byte, n)
	for {
		m, err := zr.Read(p)
		out = append(out, p[:m]...)
		for i := range p[:m] {
			p[i] = 0xa5
		}
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}

// inflate opens and reads blob with inf; src wraps the blob reader.
func inflate(blob []byte, inf *GzipInflater, src func(io.Reader) io.Reader, n int) ([]byte, error) {
	zr, err := NewGzipReader(src(bytes.NewReader(blob)), inf)
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	return readAll(zr, n)
}

func TestGzipInflatersAgree(t *testing.T) {
	random := randomBytes(3<<20+17, 1)
	text := textBytes(2<<20, 2)
	zeros := make([]byte, 9<<20) // inflates to far more than a buffer per input byte
	half := len(text) / 2
	type tcase struct {
		name string
		blob []byte
		want []byte
	}
	tests := []tcase{
		{"Random", gzipOf(t, random, gzip.DefaultCompression, gzip.Header{}), random},
		{"Text", gzipOf(t, text, gzip.BestCompression, gzip.Header{}), text},
		{"Zeros", gzipOf(t, zeros, gzip.BestSpeed, gzip.Header{}), zeros},
		{"Stored", gzipOf(t, text[:300<<10], gzip.NoCompression, gzip.Header{}), text[:300<<10]},
		{"HuffmanOnly", gzipOf(t, text[:500<<10], gzip.HuffmanOnly, gzip.Header{}), text[:500<<10]},
		{"EmptyMember", gzipOf(t, nil, gzip.DefaultCompression, gzip.Header{}), nil},
		{"HeaderFields", gzipOf(t, text[:1000], gzip.DefaultCompression,
			gzip.Header{Name: "layer.tar", Comment: "a comment", Extra: []byte("xx\x02\x00ab")}), text[:1000]},
		{"MultiMember", bytes.Join([][]byte{
			gzipOf(t, text[:half], gzip.DefaultCompression, gzip.Header{}),
			gzipOf(t, nil, gzip.DefaultCompression, gzip.Header{}),
			gzipOf(t, text[half:], gzip.BestSpeed, gzip.Header{Name: "second"}),
		}, nil), text},
	}
	var std bytes.Buffer
	sw := stdgzip.NewWriter(&std)
	sw.Write(random[:1<<20])
	sw.Close()
	tests = append(tests, tcase{"Stdlib", std.Bytes(), random[:1<<20]})
	for _, img := range imagetest.Corpus() {
		if img.Large {
			continue
		}
		for i, l := range img.Layers {
			raw, err := l.Tar()
			if err != nil {
				t.Fatal(err)
			}
			blob, err := images.Gzip.Encode(raw)
			if err != nil {
				t.Fatal(err)
			}
			tests = append(tests, tcase{fmt.Sprintf("Corpus/%s/%d", img.Name, i), blob, raw})
		}
	}
	modes := []struct {
		name string
		src  func(io.Reader) io.Reader
		n    int
	}{
		{"Whole", func(r io.Reader) io.Reader { return r }, 0},
		{"HalfReads", iotest.HalfReader, 7 << 10},
		{"OneByteReads", iotest.OneByteReader, 100 << 10},
		{"DataErrEOF", iotest.DataErrReader, 3 << 20},
	}
	for _, inf := range inflaters(t) {
		for _, tc := range tests {
			for _, m := range modes {
				if m.name == "OneByteReads" && len(tc.blob) > 1<<20 {
					continue // one byte per read of a big blob is slow, and HalfReads covers short reads
				}
				t.Run(inf.backend+"/"+tc.name+"/"+m.name, func(t *testing.T) {
					got, err := inflate(tc.blob, inf, m.src, m.n)
					if err != nil {
						t.Fatalf("inflate: %v", err)
					}
					if !bytes.Equal(got, tc.want) {
						t.Errorf("inflate yields %d bytes, want %d identical bytes", len(got), len(tc.want))
					}
				})
			}
		}
	}
}

func TestGzipInflatersReject(t *testing.T) {
	text := textBytes(1<<20, 3)
	gz := gzipOf(t, text, gzip.DefaultCompression, gzip.Header{})
	random := randomBytes(600<<10, 4)
	gzr := gzipOf(t, random, gzip.DefaultCompression, gzip.Header{})
	two := append(append([]byte{}, gz...), gzr...)
	damage := func(b []byte, off int, x byte) []byte {
		b = append([]byte{}, b...)
		if off < 0 {
			off += len(b)
		}
		b[off] ^= x
		return b
	}
	tests := []struct {
		name string
		blob []byte
		want error // nil: any error
	}{
		{"Empty", nil, io.EOF},
		{"NotGzip", []byte("this is a plain tar, honest"), gzip.ErrHeader},
		{"BadMethod", damage(gz, 2, 0x0f), gzip.ErrHeader},
		{"CorruptMiddle", damage(gz, len(gz)/2, 0x55), nil},
		{"CorruptRandomMiddle", damage(gzr, len(gzr)/2, 0x01), nil},
		{"CorruptBlockType", damage(gz, 10, 0x06), nil},
		{"BadCRC", damage(gz, -8, 0xff), gzip.ErrChecksum},
		{"BadISIZE", damage(gz, -4, 0x01), gzip.ErrChecksum},
		{"BadCRCFirstOfTwo", damage(two, len(gz)-6, 0x10), gzip.ErrChecksum},
		{"BadISIZESecondOfTwo", damage(two, -1, 0x80), gzip.ErrChecksum},
		{"TrailingGarbage", append(append([]byte{}, gz...), "garbage after the end"...), gzip.ErrHeader},
		{"TrailingZeros", append(append([]byte{}, gz...), make([]byte, 512)...), gzip.ErrHeader},
		{"TrailingShort", append(append([]byte{}, gz...), 0x1f, 0x8b, 8), io.ErrUnexpectedEOF},
		{"TrailingHeaderOnly", append(append([]byte{}, gz...), gz[:10]...), io.ErrUnexpectedEOF},
	}
	for _, cut := range []int{1, 2, 9, 10, 11, 100, len(gz) / 3, len(gz) / 2, len(gz) - 9, len(gz) - 8, len(gz) - 4, len(gz) - 1} {
		tests = append(tests, struct {
			name string
			blob []byte
			want error
		}{fmt.Sprintf("TruncatedAt%d", cut), gz[:cut], io.ErrUnexpectedEOF})
	}
	for _, cut := range []int{len(gz) + 5, len(gz) + 10, len(two) - 1000, len(two) - 1} {
		tests = append(tests, struct {
			name string
			blob []byte
			want error
		}{fmt.Sprintf("TwoTruncatedAt%d", cut), two[:cut], io.ErrUnexpectedEOF})
	}
	for _, inf := range inflaters(t) {
		for _, tc := range tests {
			for _, src := range []struct {
				name string
				wrap func(io.Reader) io.Reader
			}{{"Whole", func(r io.Reader) io.Reader { return r }}, {"HalfReads", iotest.HalfReader}} {
				t.Run(inf.backend+"/"+tc.name+"/"+src.name, func(t *testing.T) {
					_, err := inflate(tc.blob, inf, src.wrap, 64<<10)
					if err == nil {
						t.Fatal("inflate of a damaged stream succeeded")
					}
					if tc.want != nil && !errors.Is(err, tc.want) {
						t.Errorf("inflate: %v, want %v", err, tc.want)
					}
				})
			}
		}
	}
}

// TestISALSmallBuffers moves every member, block and trailer boundary
// across refills of a small input buffer.
func TestISALSmallBuffers(t *testing.T) {
	var isal *GzipInflater
	for _, inf := range inflaters(t) {
		if inf.backend == BackendISAL {
			isal = inf
		}
	}
	if isal == nil {
		return // inflaters logged why; with TC_EXPECT_ISAL=1 it failed
	}
	text := textBytes(300<<10, 11)
	random := randomBytes(100<<10, 12)
	var blob, want []byte
	for i, n := range []int{0, 1, 10, 1000, 5000, 70 << 10, 0, 300 << 10} {
		data := text[:n]
		if i%2 == 1 {
			data = random[:min(n, len(random))]
		}
		blob = append(blob, gzipOf(t, data, []int{gzip.BestSpeed, gzip.DefaultCompression, gzip.NoCompression}[i%3], gzip.Header{})...)
		want = append(want, data...)
	}
	for _, size := range []int{10, 11, 13, 17, 64, 333, 4096, 65537} {
		for _, out := range []int{1, 1000, 1 << 20} {
			t.Run(fmt.Sprintf("In%d/Out%d", size, out), func(t *testing.T) {
				zr, err := newISALReaderSize(isal.lib, bytes.NewReader(blob), size)
				if err != nil {
					t.Fatal(err)
				}
				defer zr.Close()
				got, err := readAll(zr, out)
				if err != nil {
					t.Fatalf("read: %v", err)
				}
				if !bytes.Equal(got, want) {
					t.Errorf("read %d bytes, want %d identical bytes", len(got), len(want))
				}
			})
		}
	}
}

// TestGzipReadError passes the source's error through, wrapped.
func TestGzipReadError(t *testing.T) {
	gz := gzipOf(t, textBytes(1<<20, 5), gzip.DefaultCompression, gzip.Header{})
	boom := errors.New("boom")
	for _, inf := range inflaters(t) {
		t.Run(inf.backend, func(t *testing.T) {
			src := io.MultiReader(bytes.NewReader(gz[:len(gz)/2]), iotest.ErrReader(boom))
			if _, err := inflate(nil, inf, func(io.Reader) io.Reader { return src }, 0); !errors.Is(err, boom) {
				t.Errorf("read: %v, want %v", err, boom)
			}
		})
	}
}

// stuckReader returns nothing and no error, forever.
type stuckReader struct{}

func (stuckReader) Read([]byte) (int, error) { return 0, nil }

// TestGzipStuckSource ends reads of a source that never makes progress
// with an error instead of spinning.
func TestGzipStuckSource(t *testing.T) {
	gz := gzipOf(t, textBytes(1<<20, 6), gzip.DefaultCompression, gzip.Header{})
	for _, inf := range inflaters(t) {
		t.Run(inf.backend, func(t *testing.T) {
			src := io.MultiReader(bytes.NewReader(gz[:len(gz)/2]), stuckReader{})
			if _, err := inflate(nil, inf, func(io.Reader) io.Reader { return src }, 0); !errors.Is(err, io.ErrNoProgress) {
				t.Errorf("read: %v, want %v", err, io.ErrNoProgress)
			}
		})
	}
}

func TestGzipReadAfterClose(t *testing.T) {
	gz := gzipOf(t, textBytes(1<<20, 7), gzip.DefaultCompression, gzip.Header{})
	for _, inf := range inflaters(t) {
		t.Run(inf.backend, func(t *testing.T) {
			zr, err := NewGzipReader(bytes.NewReader(gz), inf)
			if err != nil {
				t.Fatal(err)
			}
			if err := zr.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if err := zr.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			if inf.backend == BackendISAL {
				if n, err := zr.Read(make([]byte, 10)); n != 0 || err == nil {
					t.Errorf("Read after Close = %d, %v; want an error", n, err)
				}
			}
		})
	}
}

func TestLoadISALMissing(t *testing.T) {
	lib, err := loadISAL("/nonexistent/libisal.so.2")
	if err == nil || lib != nil {
		t.Fatalf("loadISAL of a missing file = %v, %v; want an error", lib, err)
	}
	if !strings.Contains(err.Error(), "/nonexistent/libisal.so.2") {
		t.Errorf("loadISAL error %q does not name the path", err)
	}
	// A library that is not libisal lacks the entry points.
	if lib, err := loadISAL("libc.so.6"); err == nil || lib != nil {
		t.Errorf("loadISAL(libc.so.6) = %v, %v; want an error", lib, err)
	}
}

func TestChooseInflater(t *testing.T) {
	okLib := &isalLib{}
	ok := func() (*isalLib, error) { return okLib, nil }
	missing := func() (*isalLib, error) { return nil, errors.New("load libisal.so.2: not found") }
	tests := []struct {
		name   string
		choice Inflater
		load   func() (*isalLib, error)
		want   string
		reason string
	}{
		{"Loads", InflaterAuto, ok, BackendISAL, ""},
		{"Missing", InflaterAuto, missing, BackendGo, "load libisal.so.2: not found"},
		{"ForcedGo", InflaterGo, ok, BackendGo, "pure-Go inflater requested"},
		{"OtherValueIsAuto", "isal", ok, BackendISAL, ""},
		{"OtherValueMissing", "auto", missing, BackendGo, "load libisal.so.2: not found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := chooseInflater(tc.choice, tc.load)
			if got.backend != tc.want || got.reason != tc.reason {
				t.Errorf("chooseInflater(%q) = %s (%q), want %s (%q)", tc.choice, got.backend, got.reason, tc.want, tc.reason)
			}
			if (got.lib != nil) != (tc.want == BackendISAL) {
				t.Errorf("chooseInflater(%q) library = %v, for backend %s", tc.choice, got.lib, got.backend)
			}
		})
	}
}

// benchTar is a ~64 MiB tar of files of layer-like content: a third
// random (compressed binaries), a third text, a third repeated records
// (tables, zero-filled images).
func benchTar(b *testing.B) []byte {
	b.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	text := textBytes(4<<20, 8)
	random := randomBytes(4<<20, 9)
	record := randomBytes(4<<10, 10)
	sizes := []int{900, 7 << 10, 40 << 10, 300 << 10, 2 << 20}
	for i := 0; buf.Len() < 64<<20; i++ {
		size := sizes[i%len(sizes)]
		data := make([]byte, 0, size)
		switch (i + i/len(sizes)) % 3 {
		case 0:
			off := (i * 7919) % (len(random) - size)
			data = append(data, random[off:off+size]...)
		case 1:
			off := (i * 104729) % (len(text) - size)
			data = append(data, text[off:off+size]...)
		default:
			for len(data) < size {
				data = append(data, record[:min(len(record), size-len(data))]...)
			}
		}
		if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("data/%03d/f%05d", i/16, i), Mode: 0o644, Size: int64(size), Typeflag: tar.TypeReg}); err != nil {
			b.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			b.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}

// BenchmarkGzipInflate inflates a ~64 MiB tar with each inflater;
// throughput is in uncompressed bytes.
func BenchmarkGzipInflate(b *testing.B) {
	raw := benchTar(b)
	gz := gzipOf(b, raw, gzip.DefaultCompression, gzip.Header{})
	b.Logf("tar %d bytes, gzip %d", len(raw), len(gz))
	for _, inf := range inflaters(b) {
		b.Run(inf.backend, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			for b.Loop() {
				zr, err := NewGzipReader(bytes.NewReader(gz), inf)
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.Copy(io.Discard, zr)
				zr.Close()
				if err != nil || n != int64(len(raw)) {
					b.Fatalf("inflated %d bytes, %v; want %d", n, err, len(raw))
				}
			}
		})
	}
}
