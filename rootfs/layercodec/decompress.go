package layercodec

import (
	"bufio"
	"errors"
	"fmt"
	"io"
)

// decompressBuffer is the read-ahead in front of the decompressor.
const decompressBuffer = 1 << 20

// Decompress returns the uncompressed stream of a layer blob, recognising
// gzip and zstd by their magic bytes (Detect) and passing anything else
// through as a plain tar; gzip inflates with gz. Closing the result frees
// the decompressor, not r.
func Decompress(r io.Reader, gz *GzipInflater) (io.ReadCloser, error) {
	br := bufio.NewReaderSize(r, decompressBuffer)
	magic, err := br.Peek(MagicLen)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("decompress: read magic: %w", err)
	}
	var rc io.ReadCloser
	switch Detect(magic) {
	case Gzip:
		rc, err = NewGzipReader(br, gz)
	case Zstd:
		rc, err = NewZstdReader(br)
	default:
		return io.NopCloser(br), nil
	}
	if err != nil {
		return nil, fmt.Errorf("decompress: %w", err)
	}
	return rc, nil
}
