package layercodec

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"
)

// failingAt is a ReaderAt over b that fails reads at offset bad.
type failingAt struct {
	*bytes.Reader
	bad int64
}

var errBadRead = errors.New("bad read")

func (f failingAt) ReadAt(p []byte, off int64) (int, error) {
	if off == f.bad {
		return 0, errBadRead
	}
	return f.Reader.ReadAt(p, off)
}

// TestReadAtInOrder reads sizes around the chunk size with several reads
// in flight: the bytes arrive whole and in order, a failed read ends it
// with that error after the bytes before it, and so does a cancelled
// context.
func TestReadAtInOrder(t *testing.T) {
	pool := new(ChunkPool)
	r := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{0, 1, readAheadChunk - 1, readAheadChunk, 5*readAheadChunk + 17} {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		var got []byte
		n, err := ReadAtInOrder(context.Background(), bytes.NewReader(b), int64(size), 3, pool, func(p []byte) error {
			got = append(got, p...)
			return nil
		})
		if err != nil || n != int64(size) || !bytes.Equal(got, b) {
			t.Errorf("%d bytes: read %d (%d handed over), equal %v, error %v", size, n, len(got), bytes.Equal(got, b), err)
		}
	}
	b := make([]byte, 4*readAheadChunk)
	n, err := ReadAtInOrder(context.Background(), failingAt{bytes.NewReader(b), 2 * readAheadChunk}, int64(len(b)), 4, pool,
		func([]byte) error { return nil })
	if !errors.Is(err, errBadRead) || n != 2*readAheadChunk {
		t.Errorf("a failed third read: %d bytes consumed, error %v; want %d and the read's error", n, err, 2*readAheadChunk)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ReadAtInOrder(ctx, bytes.NewReader(b), int64(len(b)), 2, pool, func([]byte) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled context: error %v", err)
	}
	if pool.out != 0 {
		t.Errorf("%d buffers not given back to the pool", pool.out)
	}
}
