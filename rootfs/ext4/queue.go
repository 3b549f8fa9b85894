package ext4

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	// jobSize is the size of one queued write buffer; jobBuffers bound how
	// many exist, so memory in flight stays at jobSize*jobBuffers.
	jobSize    = 2 << 20
	jobBuffers = 4
)

// wjob is a buffer of data for the image and where its pieces go.
type wjob struct {
	buf  []byte
	segs []wseg
}

// wseg places buf[off:off+n] at block start.
type wseg struct {
	start  uint64
	off, n int
}

// writeQueue writes jobs to the image in submission order on a goroutine
// that runs only while jobs are queued, so WriteData overlaps reading the
// next chunk (typically decompression) with writing the last one.
type writeQueue struct {
	f *os.File
	// direct is the image opened again with O_DIRECT, nil when the file
	// system refuses it or Options.BufferedData asks for the page cache:
	// file data, written once and read back once for the hash, then skips
	// the page cache's copy and its dirty-page accounting. On the 2-vCPU
	// VM of docs/performance.md a buffered write cost about 3 s of system
	// time a GiB (new page-cache memory the hypervisor backs on first
	// touch), a direct one 0.15 s. Used by the goroutine running jobs only,
	// until release.
	direct    *os.File
	wb        *writeback // used by the goroutine running jobs only
	free      chan []byte
	allocated int // buffers made so far; only the submitting side touches it

	mu      sync.Mutex
	cond    sync.Cond
	jobs    []*wjob
	running bool
	err     error // first write error; later jobs are dropped
}

func newWriteQueue(f *os.File, buffered bool) *writeQueue {
	q := &writeQueue{f: f, free: make(chan []byte, jobBuffers), wb: newWriteback(f)}
	if !buffered {
		q.direct = openDirect(f)
	}
	q.cond.L = &q.mu
	return q
}

// openDirect opens f's file again for direct writes, or returns nil.
// Through /proc/self/fd it is the same file whatever its name.
func openDirect(f *os.File) *os.File {
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(int(f.Fd())), unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	return os.NewFile(uintptr(fd), f.Name())
}

// blockAligned reports whether b may be written with O_DIRECT: its start
// and length are multiples of the block size (offsets always are).
func blockAligned(b []byte) bool {
	return len(b) > 0 && len(b)%BlockSize == 0 && uintptr(unsafe.Pointer(&b[0]))%BlockSize == 0
}

// writeSeg writes one segment, directly when it can. A file system that
// turns a direct write down (EINVAL: an alignment it wants larger) gets
// this and every later write through the page cache.
func (q *writeQueue) writeSeg(b []byte, off int64) error {
	if q.direct != nil && blockAligned(b) {
		_, err := q.direct.WriteAt(b, off)
		if !errors.Is(err, unix.EINVAL) {
			return err
		}
		q.closeDirect()
	}
	if _, err := q.f.WriteAt(b, off); err != nil {
		return err
	}
	q.wb.written(off, int64(len(b)))
	return nil
}

// buffer returns an empty job buffer, waiting for one to be written when
// all are in flight.
func (q *writeQueue) buffer() []byte {
	select {
	case b := <-q.free:
		return b
	default:
	}
	if q.allocated < jobBuffers {
		q.allocated++
		return make([]byte, 0, jobSize)
	}
	return <-q.free
}

func (q *writeQueue) submit(j *wjob) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.jobs = append(q.jobs, j)
	if !q.running {
		q.running = true
		go q.run()
	}
}

func (q *writeQueue) run() {
	for {
		q.mu.Lock()
		if len(q.jobs) == 0 {
			q.running = false
			q.jobs = nil
			q.cond.Broadcast()
			q.mu.Unlock()
			return
		}
		j := q.jobs[0]
		q.jobs[0] = nil
		q.jobs = q.jobs[1:]
		failed := q.err != nil
		q.mu.Unlock()

		var err error
		for _, s := range j.segs {
			if failed {
				break
			}
			if werr := q.writeSeg(j.buf[s.off:s.off+s.n], int64(s.start)*BlockSize); werr != nil {
				err = fmt.Errorf("write data at block %d: %w", s.start, werr)
				break
			}
		}
		q.free <- j.buf[:0]
		if err != nil {
			// Later jobs are dropped: the direct descriptor is done, and
			// a caller that only closes the file after a failed write
			// (no Finish or Abort) leaves nothing open on it.
			q.closeDirect()
			q.mu.Lock()
			if q.err == nil {
				q.err = err
			}
			q.mu.Unlock()
		}
	}
}

// wait blocks until every submitted job is written and returns the first
// write error.
func (q *writeQueue) wait() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.running {
		q.cond.Wait()
	}
	return q.err
}

// abort makes the queue skip the jobs not written yet (they fail with
// err), waits for the one in progress and for the writeback hints: after
// it nothing uses the file.
func (q *writeQueue) abort(err error) {
	q.mu.Lock()
	if q.err == nil {
		q.err = err
	}
	for q.running {
		q.cond.Wait()
	}
	q.mu.Unlock()
	q.release()
}

// release ends the queue's use of the file once no job runs: the
// writeback hints stop and the direct descriptor closes. It is safe to
// call more than once.
func (q *writeQueue) release() {
	q.wb.stop()
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.running {
		q.closeDirect()
	}
}

// closeDirect closes the direct descriptor, if open, by whoever may use
// it: the goroutine running jobs, or anyone once none runs.
func (q *writeQueue) closeDirect() {
	if q.direct != nil {
		q.direct.Close()
		q.direct = nil
	}
}

// failed returns the first write error so far.
func (q *writeQueue) failed() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}
