package layercodec

import (
	"errors"
	"io"
	"sync"
)

// Read-ahead geometry: chunks of readAheadChunk bytes, at most
// readAheadDepth of them filled ahead of the consumer.
const (
	readAheadChunk = 1 << 20
	readAheadDepth = 4
)

// ReadAhead reads r in its own goroutine, 4 MiB ahead of the consumer,
// so decompression (put r = Decompress(...)) runs on one core while the
// consumer (flatten's ApplyLayer) writes file data on another. Close stops
// the goroutine and waits for it: a Read of r in progress must return (bind
// r to a context). Close does not close r.
func ReadAhead(r io.Reader) io.ReadCloser {
	return ReadAheadSize(r, readAheadDepth*readAheadChunk, nil)
}

// ChunkPool keeps read-ahead buffers between ReadAheadSize readers, so
// readers that follow one another (the layers of a build, the builds of
// a node) reuse memory instead of leaving it to the garbage collector:
// without it, a build of many layers grew its peak RSS with each layer.
// The zero value is ready; it is safe for concurrent use.
type ChunkPool struct{ p sync.Pool }

func (c *ChunkPool) get() []byte {
	if c != nil {
		if b, ok := c.p.Get().(*[]byte); ok {
			return *b
		}
	}
	return make([]byte, readAheadChunk)
}

func (c *ChunkPool) put(b []byte) {
	if c != nil && cap(b) == readAheadChunk {
		b = b[:readAheadChunk]
		c.p.Put(&b)
	}
}

// ReadAheadSize is ReadAhead filling up to size bytes (at least one MiB)
// ahead of the consumer. Its buffers are taken (from pool, when not nil)
// as they are first filled, so a lead the consumer never lets it take
// costs no memory, and go back to pool on Close.
func ReadAheadSize(r io.Reader, size int, pool *ChunkPool) io.ReadCloser {
	depth := max(size/readAheadChunk, 1)
	ra := &readAhead{
		full: make(chan chunk, depth),
		free: make(chan []byte, depth+1),
		done: make(chan struct{}),
		pool: pool,
	}
	for range depth + 1 {
		ra.free <- nil // allocated by fill on first use
	}
	ra.wg.Add(1)
	go ra.fill(r)
	return ra
}

var errReadAheadClosed = errors.New("read ahead: closed")

type chunk struct {
	buf []byte
	err error
}

type readAhead struct {
	full  chan chunk
	free  chan []byte
	done  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once
	pool  *ChunkPool
	cur   []byte
	whole []byte // the buffer cur points into, returned to free when used up
	err   error
}

func (ra *readAhead) fill(r io.Reader) {
	defer ra.wg.Done()
	for {
		var buf []byte
		select {
		case buf = <-ra.free:
		case <-ra.done:
			return
		}
		if buf == nil {
			buf = ra.pool.get()
		}
		n, err := io.ReadFull(r, buf)
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = io.EOF
		}
		select {
		case ra.full <- chunk{buf[:n], err}:
		case <-ra.done:
			return
		}
		if err != nil {
			return
		}
	}
}

// Read implements io.Reader.
func (ra *readAhead) Read(p []byte) (int, error) {
	select {
	case <-ra.done:
		return 0, errReadAheadClosed
	default:
	}
	for len(ra.cur) == 0 {
		if ra.whole != nil {
			ra.free <- ra.whole[:cap(ra.whole)]
			ra.whole = nil
		}
		if ra.err != nil {
			return 0, ra.err
		}
		select {
		case c := <-ra.full:
			ra.cur, ra.whole, ra.err = c.buf, c.buf, c.err
		case <-ra.done:
			return 0, errReadAheadClosed
		}
	}
	n := copy(p, ra.cur)
	ra.cur = ra.cur[n:]
	return n, nil
}

// Close implements io.Closer.
func (ra *readAhead) Close() error {
	ra.once.Do(func() {
		close(ra.done)
		ra.wg.Wait()
		// The goroutine is gone and Read fails from now on: every
		// buffer can go back.
		ra.pool.put(ra.whole)
		ra.cur, ra.whole = nil, nil
		for len(ra.free) > 0 {
			ra.pool.put(<-ra.free)
		}
		for len(ra.full) > 0 {
			ra.pool.put((<-ra.full).buf)
		}
	})
	return nil
}
