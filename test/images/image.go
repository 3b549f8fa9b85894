package images

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"runtime"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Compression is how a layer blob is encoded.
type Compression string

// Layer encodings, each with its OCI media type.
const (
	Gzip         Compression = "gzip"
	Zstd         Compression = "zstd"
	Uncompressed Compression = "none"
)

// MediaType is the OCI layer media type of c.
func (c Compression) MediaType() types.MediaType {
	switch c {
	case Zstd:
		return types.OCILayerZStd
	case Uncompressed:
		return types.OCIUncompressedLayer
	default:
		return types.OCILayer
	}
}

// Encode compresses an uncompressed tar stream with c.
func (c Compression) Encode(tarball []byte) ([]byte, error) {
	if c == Uncompressed {
		return tarball, nil
	}
	blob, _, err := c.EncodeStream(func(w io.Writer) error {
		_, err := w.Write(tarball)
		return err
	})
	return blob, err
}

// EncodeStream compresses the tar stream gen writes with c, without ever
// holding it whole: layers far larger than their blob (decompression
// bombs) are made this way. It returns the blob and the stream's DiffID.
func (c Compression) EncodeStream(gen func(w io.Writer) error) ([]byte, v1.Hash, error) {
	var b bytes.Buffer
	diff := sha256.New()
	var zw io.WriteCloser
	switch c {
	case Uncompressed:
		zw = nopWriteCloser{&b}
	case Gzip:
		zw = gzip.NewWriter(&b)
	case Zstd:
		z, err := zstd.NewWriter(&b, zstd.WithEncoderConcurrency(1))
		if err != nil {
			return nil, v1.Hash{}, fmt.Errorf("zstd: %w", err)
		}
		zw = z
	default:
		return nil, v1.Hash{}, fmt.Errorf("unknown compression %q", c)
	}
	if err := gen(io.MultiWriter(zw, diff)); err != nil {
		return nil, v1.Hash{}, fmt.Errorf("%s: %w", c, err)
	}
	if err := zw.Close(); err != nil {
		return nil, v1.Hash{}, fmt.Errorf("%s: %w", c, err)
	}
	return b.Bytes(), v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(diff.Sum(nil))}, nil
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// Layer is one layer of an image New builds: an uncompressed tar stream
// and the encoding of its blob (Gzip when empty).
type Layer struct {
	Tar []byte
	// Stream, when set instead of Tar, writes the tar stream; it is
	// compressed as it is written and never held whole.
	Stream      func(w io.Writer) error
	Compression Compression
}

// Config is the image configuration New writes.
type Config struct {
	// Config holds Entrypoint, Cmd, Env, WorkingDir, User...
	Config v1.Config
	// Created is the image creation time (omitted when zero).
	Created time.Time
	// Platform is the image's OS and architecture (linux/<GOARCH> when
	// empty).
	Platform v1.Platform
}

// New builds an image with OCI media types from layers, bottom first. The
// result is deterministic: the same layers and configuration give the same
// manifest digest.
func New(tb testing.TB, cfg Config, layers ...Layer) v1.Image {
	tb.Helper()
	ls := make([]v1.Layer, len(layers))
	for i, l := range layers {
		c := l.Compression
		if c == "" {
			c = Gzip
		}
		if l.Stream != nil {
			blob, diffID, err := c.EncodeStream(l.Stream)
			if err != nil {
				tb.Fatalf("images: encode layer %d: %v", i, err)
			}
			ls[i] = &blobLayer{blob: blob, digest: sha256Hash(blob), diffID: diffID, enc: c, mediaType: c.MediaType()}
			continue
		}
		blob, err := c.Encode(l.Tar)
		if err != nil {
			tb.Fatalf("images: encode layer %d: %v", i, err)
		}
		ls[i] = newBlobLayer(blob, l.Tar, c)
	}
	return assemble(tb, cfg, ls)
}

// assemble makes an OCI image of ready layers.
func assemble(tb testing.TB, cfg Config, layers []v1.Layer) v1.Image {
	tb.Helper()
	p := cfg.Platform
	if p.OS == "" {
		p.OS = "linux"
	}
	if p.Architecture == "" {
		p.Architecture = runtime.GOARCH
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	cf, err := base.ConfigFile()
	if err != nil {
		tb.Fatalf("images: empty config: %v", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Config = cfg.Config
	if !cfg.Created.IsZero() {
		cf.Created = v1.Time{Time: cfg.Created}
	}
	img, err := mutate.ConfigFile(base, cf)
	if err != nil {
		tb.Fatalf("images: set config: %v", err)
	}
	adds := make([]mutate.Addendum, len(layers))
	for i, l := range layers {
		adds[i] = mutate.Addendum{Layer: l, History: v1.History{Created: v1.Time{Time: cfg.Created}, CreatedBy: fmt.Sprintf("images layer %d", i)}}
	}
	if img, err = mutate.Append(img, adds...); err != nil {
		tb.Fatalf("images: append layers: %v", err)
	}
	if _, err := img.Digest(); err != nil {
		tb.Fatalf("images: compute manifest: %v", err)
	}
	return img
}

// PlatformImage is one entry of an index NewIndex builds.
type PlatformImage struct {
	Platform v1.Platform
	Image    v1.Image
}

// NewIndex builds an OCI image index of per-platform images.
func NewIndex(tb testing.TB, entries ...PlatformImage) v1.ImageIndex {
	tb.Helper()
	adds := make([]mutate.IndexAddendum, len(entries))
	for i, e := range entries {
		p := e.Platform
		adds[i] = mutate.IndexAddendum{Add: e.Image, Descriptor: v1.Descriptor{
			MediaType: types.OCIManifestSchema1, Platform: &p}}
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
	if _, err := idx.Digest(); err != nil {
		tb.Fatalf("images: compute index: %v", err)
	}
	return idx
}

// blobLayer is a layer held in memory as its blob; the tar stream is
// decoded again when asked for.
type blobLayer struct {
	blob      []byte
	digest    v1.Hash
	diffID    v1.Hash
	enc       Compression
	mediaType types.MediaType
}

var _ v1.Layer = (*blobLayer)(nil)

func newBlobLayer(blob, tarball []byte, c Compression) *blobLayer {
	return &blobLayer{blob: blob, digest: sha256Hash(blob), diffID: sha256Hash(tarball), enc: c, mediaType: c.MediaType()}
}

func sha256Hash(b []byte) v1.Hash {
	sum := sha256.Sum256(b)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
}

// Digest is the sha256 of the blob.
func (l *blobLayer) Digest() (v1.Hash, error) { return l.digest, nil }

// DiffID is the sha256 of the tar stream.
func (l *blobLayer) DiffID() (v1.Hash, error) { return l.diffID, nil }

// Compressed returns the blob as stored.
func (l *blobLayer) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(l.blob)), nil
}

// Uncompressed decodes the blob.
func (l *blobLayer) Uncompressed() (io.ReadCloser, error) {
	switch l.enc {
	case Uncompressed:
		return io.NopCloser(bytes.NewReader(l.blob)), nil
	case Zstd:
		zr, err := zstd.NewReader(bytes.NewReader(l.blob))
		if err != nil {
			return nil, fmt.Errorf("open zstd layer: %w", err)
		}
		return zr.IOReadCloser(), nil
	default:
		zr, err := gzip.NewReader(bytes.NewReader(l.blob))
		if err != nil {
			return nil, fmt.Errorf("open gzip layer: %w", err)
		}
		return zr, nil
	}
}

// Size is the blob's length.
func (l *blobLayer) Size() (int64, error) { return int64(len(l.blob)), nil }

// MediaType is the OCI media type of the encoding.
func (l *blobLayer) MediaType() (types.MediaType, error) { return l.mediaType, nil }

// LayerDigests returns the digests of img's layer blobs, bottom first.
func LayerDigests(tb testing.TB, img v1.Image) []v1.Hash {
	tb.Helper()
	m, err := img.Manifest()
	if err != nil {
		tb.Fatalf("images: manifest: %v", err)
	}
	out := make([]v1.Hash, len(m.Layers))
	for i, l := range m.Layers {
		out[i] = l.Digest
	}
	return out
}

// LayerBlob returns the stored bytes of img's layer with digest d.
func LayerBlob(tb testing.TB, img v1.Image, d v1.Hash) []byte {
	tb.Helper()
	l, err := img.LayerByDigest(d)
	if err != nil {
		tb.Fatalf("images: layer %s: %v", d, err)
	}
	rc, err := l.Compressed()
	if err != nil {
		tb.Fatalf("images: layer %s: %v", d, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		tb.Fatalf("images: read layer %s: %v", d, err)
	}
	return b
}
