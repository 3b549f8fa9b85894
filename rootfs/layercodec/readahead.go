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
func ReadAhead(r io.Reader) io.ReadCloser { return ReadAheadSize(r, readAheadDepth*readAheadChunk) }

// ReadAheadSize is ReadAhead filling up to size bytes (at least one MiB)
// ahead of the consumer. Its buffers are allocated as they are first
// filled, so a lead the consumer never lets it take costs no memory.
func ReadAheadSize(r io.Reader, size int) io.ReadCloser {
	depth := max(size/readAheadChunk, 1)
	ra := &readAhead{
		full: make(chan chunk, depth),
		free: make(chan []byte, depth+1),
		done: make(chan struct{}),
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
			buf = make([]byte, readAheadChunk)
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
	})
	return nil
}
