package layercodec

import (
	"bytes"
	"io"
	"math/rand/v2"
	"testing"
	"time"
)

// pooled reports the pool's buffers out and kept, and its mappings.
func (c *ChunkPool) pooled() (out, free, maps int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out, len(c.free), len(c.maps)
}

// waitOut waits until the pool has handed out n buffers.
func waitOut(t *testing.T, c *ChunkPool, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, _, _ := c.pooled()
		if out == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool hands out %d buffers, want %d", out, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func randomData(n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func TestChunkPoolMapsWhileInUseOnly(t *testing.T) {
	data := randomData(6 << 20)
	pool := new(ChunkPool)
	first := ReadAheadSize(bytes.NewReader(data), 4<<20, pool)
	second := ReadAheadSize(bytes.NewReader(data), 4<<20, pool)
	waitOut(t, pool, 10) // both leads filled: 4 + 1 buffers each
	got, err := io.ReadAll(first)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("first reader: %d bytes, %v; want the %d bytes of the source", len(got), err, len(data))
	}
	first.Close()
	if out, free, maps := pool.pooled(); out != 5 || free != 5 || maps != 10 {
		t.Errorf("one of two readers closed: %d out, %d free, %d mappings; want 5, 5, 10 (kept for the next reader)", out, free, maps)
	}
	third := ReadAheadSize(bytes.NewReader(data), 4<<20, pool)
	if got, err := io.ReadAll(third); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("third reader: %d bytes, %v", len(got), err)
	}
	third.Close()
	if _, _, maps := pool.pooled(); maps != 10 {
		t.Errorf("%d mappings after a reader on kept buffers, want still 10", maps)
	}
	second.Close()
	if out, free, maps := pool.pooled(); out != 0 || free != 0 || maps != 0 {
		t.Errorf("every reader closed: %d out, %d free, %d mappings; want none", out, free, maps)
	}
}

func TestReadAheadShrinkGivesBuffersBack(t *testing.T) {
	data := randomData(40 << 20)
	pool := new(ChunkPool)
	ra := ReadAheadSize(bytes.NewReader(data), 16<<20, pool)
	defer ra.Close()
	waitOut(t, pool, 17)
	ra.Shrink(32 << 20) // never grows
	ra.Shrink(4 << 20)
	got := make([]byte, 0, len(data))
	buf := make([]byte, 64<<10)
	for len(got) < 30<<20 {
		n, err := ra.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	if out, _, _ := pool.pooled(); out > 5 {
		t.Errorf("%d buffers out after Shrink(4 MiB) and 30 MiB read, want at most 5", out)
	}
	rest, err := io.ReadAll(ra)
	if err != nil || !bytes.Equal(append(got, rest...), data) {
		t.Fatalf("read %d bytes, %v; want the %d bytes of the source", len(got)+len(rest), err, len(data))
	}
}
