package flatten

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

var (
	gzipMagic = []byte{0x1f, 0x8b}
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

// decompressBuffer is the read-ahead in front of the decompressor.
const decompressBuffer = 1 << 20

// Decompress returns the uncompressed stream of a layer blob, recognising
// gzip and zstd by their magic bytes and passing anything else through as
// a plain tar. Closing the result frees the decompressor, not r.
func Decompress(r io.Reader) (io.ReadCloser, error) {
	br := bufio.NewReaderSize(r, decompressBuffer)
	magic, err := br.Peek(len(zstdMagic))
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("decompress: read magic: %w", err)
	}
	switch {
	case bytes.HasPrefix(magic, gzipMagic):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("decompress: gzip: %w", err)
		}
		return zr, nil
	case bytes.HasPrefix(magic, zstdMagic):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true))
		if err != nil {
			return nil, fmt.Errorf("decompress: zstd: %w", err)
		}
		return zstdCloser{zr}, nil
	default:
		return io.NopCloser(br), nil
	}
}

// zstdCloser adapts zstd.Decoder, whose Close returns nothing.
type zstdCloser struct{ d *zstd.Decoder }

func (z zstdCloser) Read(p []byte) (int, error) { return z.d.Read(p) }

func (z zstdCloser) Close() error {
	z.d.Close()
	return nil
}
