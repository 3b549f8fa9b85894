package blobstore_test

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/test/s3server"
)

// s3srv is the package's one versitygw, started on first use.
var s3srv s3server.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	s3srv.Close()
	os.Exit(code)
}

// randomBytes returns n reproducible pseudo-random bytes and their sha256.
func randomBytes(n int, seed uint64) ([]byte, string) {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed))
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint64())
	}
	return b, sha256Hex(b)
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// streamReader yields size pseudo-random bytes (a function of the offset
// and seed, whatever the read sizes) without holding them, and is not
// seekable: a Put that buffered the whole object would show in the heap.
type streamReader struct {
	seed      uint64
	pos, size int64
	// onRead, if set, sees the running total after each read.
	onRead func(total int64)
}

func newStreamReader(size int64, seed uint64) *streamReader {
	return &streamReader{seed: seed | 1, size: size}
}

func (s *streamReader) Read(p []byte) (int, error) {
	if s.pos >= s.size {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), s.size-s.pos))
	for i := range n {
		p[i] = byte((uint64(s.pos+int64(i)) * 0x9E3779B97F4A7C15 * s.seed) >> 56)
	}
	s.pos += int64(n)
	if s.onRead != nil {
		s.onRead(s.pos)
	}
	return n, nil
}

// streamSHA256 hashes what newStreamReader(size, seed) yields.
func streamSHA256(tb testing.TB, size int64, seed uint64) string {
	tb.Helper()
	h := sha256.New()
	if _, err := io.Copy(h, newStreamReader(size, seed)); err != nil {
		tb.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}
