package ext4

import (
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// writebackBatch is the contiguous span of written data handed to the
// kernel's writeback at once.
const writebackBatch = 8 << 20

// maxWritebackPending bounds the spans waiting to be handed over; beyond it
// new spans are left to the final fsync.
const maxWritebackPending = 64

// span is a byte range of the image.
type span struct{ off, n int64 }

// writeback starts the kernel's writeback of file data soon after it is
// written, so that the disk works while later layers are still being
// decompressed and the final fsync finds little left to do. The dirty page
// limits of a large machine would otherwise hold the whole image in memory
// until that fsync. It is a hint only: sync_file_range runs on a goroutine
// of its own (it may block while the device is busy, which must not stall
// the write queue), errors are ignored, and the fsync remains what makes
// the image durable.
type writeback struct {
	sync func(span) // sync_file_range(SYNC_FILE_RANGE_WRITE) in production
	cur  span       // the contiguous span growing; used by written's caller only

	mu      sync.Mutex
	pending []span
	running bool
	// idle is signalled when run exits; made by the first stop that waits.
	idle *sync.Cond
}

func newWriteback(f *os.File) *writeback {
	fd := int(f.Fd())
	return &writeback{sync: func(s span) {
		_ = unix.SyncFileRange(fd, s.off, s.n, unix.SYNC_FILE_RANGE_WRITE)
	}}
}

// stop drops the spans not handed over yet and waits for the one in
// progress: after it no hint uses the file's descriptor, which may then be
// closed (and its number reused).
func (w *writeback) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending = nil
	for w.running {
		if w.idle == nil {
			w.idle = sync.NewCond(&w.mu)
		}
		w.idle.Wait()
	}
}

// written records n bytes written at off. Contiguous writes are gathered
// until they span writebackBatch bytes; the tail is left to the fsync.
func (w *writeback) written(off, n int64) {
	if w.cur.n > 0 && w.cur.off+w.cur.n == off {
		w.cur.n += n
	} else {
		w.cur = span{off, n}
	}
	if w.cur.n < writebackBatch {
		return
	}
	s := w.cur
	w.cur = span{}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.pending) >= maxWritebackPending {
		return
	}
	w.pending = append(w.pending, s)
	if !w.running {
		w.running = true
		go w.run()
	}
}

// run hands pending spans to the kernel and exits when none are left.
func (w *writeback) run() {
	for {
		w.mu.Lock()
		if len(w.pending) == 0 {
			w.running = false
			w.pending = nil
			if w.idle != nil {
				w.idle.Broadcast()
			}
			w.mu.Unlock()
			return
		}
		s := w.pending[0]
		w.pending = w.pending[1:]
		w.mu.Unlock()
		w.sync(s)
	}
}
