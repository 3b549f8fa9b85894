package bench

import (
	"archive/tar"
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// layerFile is a layer blob kept in a file, gzip unless Zstd, with its
// digests known from when it was written.
type layerFile struct {
	Path string `json:"path"`
	Zstd bool   `json:"zstd,omitempty"`
	// Blob is the size of the compressed blob, Tar of the tar stream.
	Blob   int64   `json:"blob"`
	Tar    int64   `json:"tar"`
	Digest v1.Hash `json:"digest"`
	DiffID v1.Hash `json:"diff_id"`
	// Entries counts the tar entries.
	Entries int `json:"entries"`
}

// countingTar is a tar writer that counts its entries.
type countingTar struct {
	*tar.Writer
	entries int
}

// WriteHeader writes hdr and counts it.
func (c *countingTar) WriteHeader(hdr *tar.Header) error {
	c.entries++
	return c.Writer.WriteHeader(hdr)
}

// writeLayer writes the tar stream fill produces, gzip-compressed at the
// default level (what docker and buildkit push), to path. The result is
// deterministic: the gzip header carries no name and no time.
func writeLayer(path string, fill func(tw *countingTar) error) (*layerFile, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("write layer: %w", err)
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	blobHash, tarHash := sha256.New(), sha256.New()
	blobCount, tarCount := &countWriter{}, &countWriter{}
	zw, err := gzip.NewWriterLevel(io.MultiWriter(bw, blobHash, blobCount), gzip.DefaultCompression)
	if err != nil {
		return nil, fmt.Errorf("write layer: %w", err)
	}
	tw := &countingTar{Writer: tar.NewWriter(io.MultiWriter(zw, tarHash, tarCount))}
	if err := fill(tw); err != nil {
		return nil, fmt.Errorf("write layer %s: %w", path, err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("write layer: close tar: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("write layer: close gzip: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return nil, fmt.Errorf("write layer: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("write layer: %w", err)
	}
	return &layerFile{
		Path: path, Blob: blobCount.n, Tar: tarCount.n, Entries: tw.entries,
		Digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(blobHash.Sum(nil))},
		DiffID: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(tarHash.Sum(nil))},
	}, nil
}

// valid reports whether the blob file is still the one described.
func (l *layerFile) valid() bool {
	fi, err := os.Stat(l.Path)
	return err == nil && fi.Size() == l.Blob
}

// v1Layer presents the file as a go-containerregistry layer.
func (l *layerFile) v1Layer() v1.Layer { return fileLayer{l} }

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}

// fileLayer implements v1.Layer over a layerFile.
type fileLayer struct{ l *layerFile }

var _ v1.Layer = fileLayer{}

// Digest is the sha256 of the blob.
func (f fileLayer) Digest() (v1.Hash, error) { return f.l.Digest, nil }

// DiffID is the sha256 of the tar stream.
func (f fileLayer) DiffID() (v1.Hash, error) { return f.l.DiffID, nil }

// Compressed opens the blob.
func (f fileLayer) Compressed() (io.ReadCloser, error) { return os.Open(f.l.Path) }

// Uncompressed opens the tar stream.
func (f fileLayer) Uncompressed() (io.ReadCloser, error) {
	file, err := os.Open(f.l.Path)
	if err != nil {
		return nil, err
	}
	if f.l.Zstd {
		zr, err := zstd.NewReader(bufio.NewReaderSize(file, 1<<20))
		if err != nil {
			file.Close()
			return nil, fmt.Errorf("open layer %s: %w", f.l.Path, err)
		}
		return readCloser{zr, func() error { zr.Close(); return file.Close() }}, nil
	}
	zr, err := gzip.NewReader(bufio.NewReaderSize(file, 1<<20))
	if err != nil {
		file.Close()
		return nil, fmt.Errorf("open layer %s: %w", f.l.Path, err)
	}
	return readCloser{zr, func() error { zr.Close(); return file.Close() }}, nil
}

// Size is the blob's length.
func (f fileLayer) Size() (int64, error) { return f.l.Blob, nil }

// MediaType is OCI gzip or zstd.
func (f fileLayer) MediaType() (types.MediaType, error) {
	if f.l.Zstd {
		return types.OCILayerZStd, nil
	}
	return types.OCILayer, nil
}

// transcodeZstd writes l's tar stream again as a zstd blob (default level)
// at path: the same layer (diff id) with another encoding.
func transcodeZstd(l *layerFile, path string) (*layerFile, error) {
	r, err := fileLayer{l}.Uncompressed()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("transcode layer: %w", err)
	}
	defer f.Close()
	h, count := sha256.New(), &countWriter{}
	bw := bufio.NewWriterSize(io.MultiWriter(f, h, count), 1<<20)
	zw, err := zstd.NewWriter(bw)
	if err != nil {
		return nil, fmt.Errorf("transcode layer: %w", err)
	}
	if _, err := io.Copy(zw, r); err != nil {
		return nil, fmt.Errorf("transcode layer %s: %w", l.Path, err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("transcode layer: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return nil, fmt.Errorf("transcode layer: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("transcode layer: %w", err)
	}
	return &layerFile{Path: path, Zstd: true, Blob: count.n, Tar: l.Tar, Entries: l.Entries,
		Digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}, DiffID: l.DiffID}, nil
}

type readCloser struct {
	io.Reader
	close func() error
}

func (r readCloser) Close() error { return r.close() }

// saveJSON writes v to path atomically.
func saveJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
