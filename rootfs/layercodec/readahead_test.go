package layercodec_test

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/layercodec"
)

func TestReadAhead(t *testing.T) {
	data, err := io.ReadAll(imagetest.Blob("x", 10<<20+12345, 3).Content())
	if err != nil {
		t.Fatal(err)
	}
	for name, src := range map[string]io.Reader{
		"Plain":    bytes.NewReader(data),
		"OneByte":  iotest.OneByteReader(bytes.NewReader(data[:100000])),
		"HalfRead": iotest.HalfReader(bytes.NewReader(data)),
	} {
		t.Run(name, func(t *testing.T) {
			want := data
			if name == "OneByte" {
				want = data[:100000]
			}
			ra := layercodec.ReadAheadSize(src, 4<<20, nil)
			if err := iotest.TestReader(ra, want); err != nil {
				t.Error(err)
			}
			if err := ra.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}

	t.Run("Size", func(t *testing.T) {
		pool := new(layercodec.ChunkPool) // shared: buffers of one reader serve the next
		for _, size := range []int{0, 1 << 20, 3<<20 + 5, 32 << 20, 4 << 20} {
			src := &countingReader{r: bytes.NewReader(data)}
			ra := layercodec.ReadAheadSize(src, size, pool)
			if err := iotest.TestReader(ra, data); err != nil {
				t.Errorf("ReadAheadSize(%d): %v", size, err)
			}
			ra.Close()
		}
		// WriteTo hands over the same bytes, after a Read too, and
		// returns the writer's error.
		ra := layercodec.ReadAheadSize(bytes.NewReader(data), 4<<20, pool)
		head := make([]byte, 1000)
		if _, err := io.ReadFull(ra, head); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if n, err := ra.WriteTo(&out); err != nil || n != int64(len(data)-len(head)) || !bytes.Equal(append(head, out.Bytes()...), data) {
			t.Errorf("Read then WriteTo: %d bytes, %v; want the rest of the %d bytes", n, err, len(data))
		}
		ra.Close()
		ra = layercodec.ReadAheadSize(bytes.NewReader(data), 4<<20, pool)
		boom := errors.New("boom")
		if _, err := ra.WriteTo(failingWriter{boom}); !errors.Is(err, boom) {
			t.Errorf("WriteTo a failing writer: %v, want %v", err, boom)
		}
		ra.Close()
		// A lead of 8 MiB reads at most 8 MiB past the chunk in hand.
		src := &countingReader{r: bytes.NewReader(data)}
		ra = layercodec.ReadAheadSize(src, 8<<20, nil)
		if _, err := io.ReadFull(ra, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		ra.Close() // waits for the goroutine: the count is final
		if src.n > 9<<20 {
			t.Errorf("read %d bytes ahead with a lead of 8 MiB", src.n)
		}
	})

	t.Run("Error", func(t *testing.T) {
		boom := errors.New("boom")
		ra := layercodec.ReadAheadSize(io.MultiReader(bytes.NewReader(data[:3<<20]), iotest.ErrReader(boom)), 4<<20, nil)
		defer ra.Close()
		got, err := io.ReadAll(ra)
		if !errors.Is(err, boom) || !bytes.Equal(got, data[:3<<20]) {
			t.Errorf("ReadAll = %d bytes, %v; want %d bytes then %v", len(got), err, 3<<20, boom)
		}
	})

	t.Run("CloseEarly", func(t *testing.T) {
		src := &countingReader{r: bytes.NewReader(data)}
		ra := layercodec.ReadAheadSize(src, 4<<20, nil)
		if _, err := io.ReadFull(ra, make([]byte, 1000)); err != nil {
			t.Fatal(err)
		}
		if err := ra.Close(); err != nil {
			t.Fatal(err)
		}
		// Close waited for the goroutine, so the count is final: at most the
		// chunks that fit ahead of the consumer were read.
		if src.n >= int64(len(data)) {
			t.Errorf("read %d bytes of %d after an early Close", src.n, len(data))
		}
		if _, err := ra.Read(make([]byte, 10)); err == nil {
			t.Error("Read after Close succeeded")
		}
	})
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// failingWriter fails every write with err.
type failingWriter struct{ err error }

func (f failingWriter) Write([]byte) (int, error) { return 0, f.err }
