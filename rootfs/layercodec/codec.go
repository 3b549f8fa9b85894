package layercodec

import (
	"bytes"
	"fmt"
	"io"

	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"
)

// Compression is the encoding of a layer blob.
type Compression int

// The encodings Detect tells apart.
const (
	// Uncompressed is a plain tar (or anything that is neither gzip nor zstd).
	Uncompressed Compression = iota
	// Gzip is a gzip stream, possibly of several members.
	Gzip
	// Zstd is a zstd stream.
	Zstd
)

var (
	gzipMagic = []byte{0x1f, 0x8b}
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

// MagicLen is the number of leading bytes Detect needs to tell every
// encoding apart; gzip is recognised from the first two.
const MagicLen = 4

// Detect names the encoding of a blob from its first bytes (up to MagicLen).
func Detect(magic []byte) Compression {
	switch {
	case bytes.HasPrefix(magic, gzipMagic):
		return Gzip
	case bytes.HasPrefix(magic, zstdMagic):
		return Zstd
	default:
		return Uncompressed
	}
}

// String implements fmt.Stringer.
func (c Compression) String() string {
	switch c {
	case Gzip:
		return "gzip"
	case Zstd:
		return "zstd"
	default:
		return "uncompressed"
	}
}

// MediaType is the layer media type a synthesized Docker v2 manifest gives a
// blob of this encoding (as go-containerregistry's tarball package does):
// Docker's gzip and uncompressed layer types, and the OCI zstd layer type.
func (c Compression) MediaType() types.MediaType {
	switch c {
	case Gzip:
		return types.DockerLayer
	case Zstd:
		return types.OCILayerZStd
	default:
		return types.DockerUncompressedLayer
	}
}

// NewZstdReader opens a zstd stream with a single-threaded, low-memory
// decoder: builds run in parallel and each already has a core of its own.
func NewZstdReader(r io.Reader) (io.ReadCloser, error) {
	zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true))
	if err != nil {
		return nil, fmt.Errorf("zstd: %w", err)
	}
	return zstdCloser{zr}, nil
}

// zstdCloser adapts zstd.Decoder, whose Close returns nothing.
type zstdCloser struct{ d *zstd.Decoder }

func (z zstdCloser) Read(p []byte) (int, error) { return z.d.Read(p) }

func (z zstdCloser) Close() error {
	z.d.Close()
	return nil
}
