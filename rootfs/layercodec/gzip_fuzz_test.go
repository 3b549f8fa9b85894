package layercodec

import (
	"bytes"
	"io"
	"testing"

	"github.com/klauspost/compress/gzip"
)

// fuzzOutputCap bounds what one fuzz input may inflate to.
const fuzzOutputCap = 8 << 20

// FuzzGzipInflaters feeds the same bytes to both inflaters: neither may
// panic or hang, they agree on whether the stream is valid, and a valid
// stream inflates to the same bytes.
func FuzzGzipInflaters(f *testing.F) {
	text := textBytes(64<<10, 13)
	f.Add(gzipOf(f, text, gzip.DefaultCompression, gzip.Header{}))
	f.Add(gzipOf(f, text[:100], gzip.NoCompression, gzip.Header{Name: "n", Comment: "c", Extra: []byte("ab\x00\x00")}))
	f.Add(append(gzipOf(f, nil, gzip.BestSpeed, gzip.Header{}), gzipOf(f, randomBytes(1000, 14), gzip.HuffmanOnly, gzip.Header{})...))
	f.Add([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	infs := inflaters(f)
	f.Fuzz(func(t *testing.T, blob []byte) {
		var outs [][]byte
		var errs []error
		for _, inf := range infs {
			out, err := inflateCapped(blob, inf)
			outs, errs = append(outs, out), append(errs, err)
		}
		for i := 1; i < len(infs); i++ {
			if (errs[0] == nil) != (errs[i] == nil) {
				t.Fatalf("%s: %v; %s: %v", infs[0].backend, errs[0], infs[i].backend, errs[i])
			}
			if errs[0] == nil && !bytes.Equal(outs[0], outs[i]) {
				t.Fatalf("%s inflates to %d bytes, %s to %d different bytes", infs[0].backend, len(outs[0]), infs[i].backend, len(outs[i]))
			}
		}
	})
}

// inflateCapped inflates blob with inf, up to fuzzOutputCap bytes; a
// stream that inflates to more counts as valid so far.
func inflateCapped(blob []byte, inf *GzipInflater) ([]byte, error) {
	zr, err := NewGzipReader(bytes.NewReader(blob), inf)
	if err != nil {
		return nil, err
	}
	defer zr.Close()
	return io.ReadAll(io.LimitReader(zr, fuzzOutputCap))
}
