package ext4

import (
	"fmt"
	"os"
	"sync"
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
	f         *os.File
	wb        *writeback // used by the goroutine running jobs only
	free      chan []byte
	allocated int // buffers made so far; only the submitting side touches it

	mu      sync.Mutex
	cond    sync.Cond
	jobs    []*wjob
	running bool
	err     error // first write error; later jobs are dropped
}

func newWriteQueue(f *os.File) *writeQueue {
	q := &writeQueue{f: f, free: make(chan []byte, jobBuffers), wb: newWriteback(f)}
	q.cond.L = &q.mu
	return q
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
			if _, werr := q.f.WriteAt(j.buf[s.off:s.off+s.n], int64(s.start)*BlockSize); werr != nil {
				err = fmt.Errorf("write data at block %d: %w", s.start, werr)
				break
			}
			q.wb.written(int64(s.start)*BlockSize, int64(s.n))
		}
		q.free <- j.buf[:0]
		if err != nil {
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
	q.wb.stop()
}

// failed returns the first write error so far.
func (q *writeQueue) failed() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}
