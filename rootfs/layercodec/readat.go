package layercodec

import (
	"context"
	"errors"
	"io"
)

// chunkRead is one positional read of ReadAtInOrder.
type chunkRead struct {
	buf []byte
	n   int
	err error
}

// ReadAtInOrder hands fn the bytes of r from 0 to size, in order, in
// chunks of the pool's buffer size, with up to inFlight chunks read at
// once by positional reads. Direct I/O reads one request at a time
// otherwise: the device idles between them, and a hash waiting on them
// runs at the device's latency rather than its throughput. fn must not
// keep the slice. It returns fn's first error, the first read error (with
// consumed, the bytes handed to fn before it, so a caller can tell a
// refused first read), or ctx's error.
func ReadAtInOrder(ctx context.Context, r io.ReaderAt, size int64, inFlight int, pool *ChunkPool, fn func([]byte) error) (consumed int64, err error) {
	inFlight = max(inFlight, 1)
	pending := make(chan chan chunkRead, inFlight)
	stop := make(chan struct{})
	go func() {
		defer close(pending)
		for off := int64(0); off < size; off += readAheadChunk {
			select {
			case <-stop:
				return
			default:
			}
			res := make(chan chunkRead, 1)
			select {
			case pending <- res:
			case <-stop:
				return
			}
			go func(off int64) {
				// Whole buffers: direct I/O reads whole blocks, and the
				// last read ends short of the buffer at the end of file.
				buf := pool.get()
				n, err := r.ReadAt(buf, off)
				n = int(min(int64(n), size-off))
				if err == io.EOF && off+int64(n) == size {
					err = nil
				}
				res <- chunkRead{buf, n, err}
			}(off)
		}
	}()
	defer func() {
		// Stop the producer and wait for the reads it started, giving
		// their buffers back.
		close(stop)
		for res := range pending {
			pool.put((<-res).buf)
		}
	}()
	for res := range pending {
		c := <-res
		switch {
		case ctx.Err() != nil:
			err = ctx.Err()
		case c.err != nil:
			err = c.err
		case c.n == 0:
			err = io.ErrUnexpectedEOF
		default:
			err = fn(c.buf[:c.n])
			consumed += int64(c.n)
		}
		pool.put(c.buf)
		if err != nil {
			return consumed, err
		}
	}
	if consumed != size {
		return consumed, errors.New("read at in order: stopped short of the size")
	}
	return consumed, nil
}
