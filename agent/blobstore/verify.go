package blobstore

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"strings"
)

// verifier hashes and counts the bytes read through it, so a Put can refuse
// to publish an object whose content differs from the size and sha256 given.
type verifier struct {
	r    io.Reader
	h    hash.Hash
	n    int64
	size int64
	want string
}

func newVerifier(r io.Reader, size int64, sha256hex string) *verifier {
	return &verifier{r: r, h: sha256.New(), size: size, want: strings.ToLower(sha256hex)}
}

// Read reads from the source, hashing and counting.
func (v *verifier) Read(p []byte) (int, error) {
	n, err := v.r.Read(p)
	v.h.Write(p[:n])
	v.n += int64(n)
	return n, err
}

// fill reads exactly len(buf) bytes; a source that ends early is a size
// mismatch.
func (v *verifier) fill(buf []byte) error {
	if _, err := io.ReadFull(v, buf); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: source ended after %d of %d bytes", ErrSizeMismatch, v.n, v.size)
		}
		return fmt.Errorf("read source: %w", err)
	}
	return nil
}

// finish checks, once size bytes were read, that the source ends there and
// that its sha256 is the one given.
func (v *verifier) finish() error {
	var b [1]byte
	n, err := io.ReadFull(v.r, b[:])
	if n > 0 {
		return fmt.Errorf("%w: source is longer than %d bytes", ErrSizeMismatch, v.size)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read source: %w", err)
	}
	if got := hex.EncodeToString(v.h.Sum(nil)); got != v.want {
		return fmt.Errorf("%w: content hashes to %s, want %s", ErrChecksumMismatch, got, v.want)
	}
	return nil
}
