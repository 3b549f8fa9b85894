package layercodec

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// readAheadChunk is the size of a read-ahead buffer; a reader's lead is
// a whole number of them.
const readAheadChunk = 1 << 20

// ChunkPool keeps the read-ahead buffers of ReadAheadSize readers
// outside the Go heap, in anonymous mappings of their own, and reuses them
// while any reader holds one. On the heap (a sync.Pool, before) the
// buffers of two layers' leads raised the collector's goal, which is
// twice the live heap, and each collection dropped the idle ones for the
// next layer to allocate again. When the last buffer comes back the
// mappings go, so an idle agent holds none. The zero value is ready; it
// is safe for concurrent use.
type ChunkPool struct {
	mu   sync.Mutex
	free [][]byte
	out  int            // buffers handed out and not yet back
	maps map[*byte]bool // the buffers that are mappings, by first byte
}

func (c *ChunkPool) get() []byte {
	if c == nil {
		return make([]byte, readAheadChunk)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.out++
	if n := len(c.free); n > 0 {
		b := c.free[n-1]
		c.free = c.free[:n-1]
		return b
	}
	b, err := unix.Mmap(-1, 0, readAheadChunk, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		// Out of mappings: the heap serves, and put leaves it to the
		// collector.
		return make([]byte, readAheadChunk)
	}
	if c.maps == nil {
		c.maps = make(map[*byte]bool)
	}
	c.maps[&b[0]] = true
	return b
}

// put takes b back; b must not be used after. Heap buffers (from a nil
// pool, or a failed mapping) are left to the collector.
func (c *ChunkPool) put(b []byte) {
	if c == nil || b == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.out--
	if cap(b) == readAheadChunk && c.maps[&b[:1][0]] {
		c.free = append(c.free, b[:readAheadChunk])
	}
	if c.out > 0 {
		return
	}
	for _, f := range c.free {
		delete(c.maps, &f[0])
		_ = unix.Munmap(f) // fails only for a range that is not a mapping
	}
	c.free = nil
}

// ReadAheadSize reads r in its own goroutine, up to size bytes (at least
// one MiB) ahead of the consumer, so decompression (put r =
// Decompress(...)) runs on one core while the consumer (flatten's
// ApplyLayer) writes file data on another. Close stops the goroutine and
// waits for it: a Read of r in progress must return (bind r to a context).
// Close does not close r. Its buffers are taken (from pool, when not nil)
// as they are first filled, so a lead the consumer never lets it take
// costs no memory, and go back to pool on Close, or once used when
// Shrink lowers the lead.
func ReadAheadSize(r io.Reader, size int, pool *ChunkPool) *ReadAheadReader {
	depth := leadDepth(size)
	ra := &ReadAheadReader{
		full: make(chan chunk, depth),
		free: make(chan []byte, depth+1),
		done: make(chan struct{}),
		pool: pool,
	}
	ra.slots.Store(int32(depth + 1))
	ra.keep.Store(int32(depth + 1))
	for range depth + 1 {
		ra.free <- nil // allocated by fill on first use
	}
	ra.wg.Add(1)
	go ra.fill(r)
	return ra
}

// leadDepth is the number of buffers a lead of size bytes fills ahead.
func leadDepth(size int) int { return max(size/readAheadChunk, 1) }

// Shrink lowers the lead to size bytes (it never grows): buffers beyond
// it go back to the pool as the consumer uses them up, and slots not yet
// filled are dropped. A layer read ahead far while another one is applied
// keeps only a short lead once it is the one applied, leaving the memory
// to the next layer's lead.
func (ra *ReadAheadReader) Shrink(size int) {
	n := int32(leadDepth(size) + 1)
	for {
		k := ra.keep.Load()
		if n >= k || ra.keep.CompareAndSwap(k, n) {
			return
		}
	}
}

// drop gives up one buffer slot if there are more than the lead keeps.
func (ra *ReadAheadReader) drop() bool {
	for {
		n := ra.slots.Load()
		if n <= ra.keep.Load() {
			return false
		}
		if ra.slots.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

var errReadAheadClosed = errors.New("read ahead: closed")

type chunk struct {
	buf []byte
	err error
}

// ReadAheadReader is the reader ReadAheadSize returns.
type ReadAheadReader struct {
	// slots counts the buffers (filled, or not yet allocated) in
	// circulation between the goroutine and the consumer; keep is how
	// many Shrink leaves.
	slots, keep atomic.Int32
	full        chan chunk
	free        chan []byte
	done        chan struct{}
	wg          sync.WaitGroup
	once        sync.Once
	pool        *ChunkPool
	cur         []byte
	whole       []byte // the buffer cur points into, returned to free when used up
	err         error
}

func (ra *ReadAheadReader) fill(r io.Reader) {
	defer ra.wg.Done()
	for {
		var buf []byte
		select {
		case buf = <-ra.free:
		case <-ra.done:
			return
		}
		if buf == nil {
			if ra.drop() {
				continue
			}
			buf = ra.pool.get()
		}
		n, err := io.ReadFull(r, buf)
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = io.EOF
		}
		select {
		case ra.full <- chunk{buf[:n], err}:
		case <-ra.done:
			ra.pool.put(buf) // Close has nothing else to find it by
			return
		}
		if err != nil {
			return
		}
	}
}

// next makes ra.cur hold the next unread bytes, recycling the buffer used
// up, or returns the stream's error (io.EOF at its end) once none are left.
func (ra *ReadAheadReader) next() error {
	select {
	case <-ra.done:
		return errReadAheadClosed
	default:
	}
	for len(ra.cur) == 0 {
		if ra.whole != nil {
			if ra.drop() {
				ra.pool.put(ra.whole)
			} else {
				ra.free <- ra.whole[:cap(ra.whole)]
			}
			ra.whole = nil
		}
		if ra.err != nil {
			return ra.err
		}
		select {
		case c := <-ra.full:
			ra.cur, ra.whole, ra.err = c.buf, c.buf, c.err
		case <-ra.done:
			return errReadAheadClosed
		}
	}
	return nil
}

// Read implements io.Reader.
func (ra *ReadAheadReader) Read(p []byte) (int, error) {
	if err := ra.next(); err != nil {
		return 0, err
	}
	n := copy(p, ra.cur)
	ra.cur = ra.cur[n:]
	return n, nil
}

// WriteTo implements io.WriterTo: io.Copy hands w the filled buffers
// themselves, without a copy into a buffer of its own.
func (ra *ReadAheadReader) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		if err := ra.next(); err != nil {
			if errors.Is(err, io.EOF) {
				return total, nil
			}
			return total, err
		}
		n, err := w.Write(ra.cur)
		total += int64(n)
		ra.cur = ra.cur[n:]
		if err != nil {
			return total, err
		}
	}
}

// Close implements io.Closer.
func (ra *ReadAheadReader) Close() error {
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
