package ext4

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
)

const (
	// defaultMaxSize applies when Options.MaxSize is zero.
	defaultMaxSize = 1 << 40
	// maxMaxSize keeps every block number within 32 bits.
	maxMaxSize = (1 << 32) * BlockSize
	// maxExtentLen is the longest initialized extent ext4 allows.
	maxExtentLen = 32768
	// maxFileBlocks bounds a file's logical block numbers (32 bits).
	maxFileBlocks = 1<<32 - 1
	// ioBufSize is the WriteData read buffer: the caller's reader is
	// read in pieces this large.
	ioBufSize = 1 << 20
	descSize  = 64
	// minJournalBlocks is jbd2's lower bound.
	minJournalBlocks = 1024
)

// extent maps length blocks of a file starting at logical block logical to
// physical blocks starting at physical. length never exceeds maxExtentLen.
type extent struct {
	logical  uint32
	length   uint32
	physical uint64
}

var zeroBlock [BlockSize]byte

// Writer produces one ext4 image in a single pass: file data first, as the
// caller streams it (WriteData), then all metadata in Finish.
type Writer struct {
	// wmu serializes WriteData and Finish, which own buf. It is not held
	// by readers, so WriteData may read from an OpenData reader.
	wmu sync.Mutex
	buf []byte

	// mu guards everything below; it is held only briefly.
	mu   sync.Mutex
	f    *os.File
	opts Options

	maxBlocks  uint64 // image size limit in blocks
	gdtReserve uint64 // GDT blocks reserved after every superblock copy
	alloc      *allocator
	// q writes data asynchronously; cur is the job being filled. Pieces
	// of consecutive files that are adjacent on disk merge into one write.
	q   *writeQueue
	cur *wjob
	// dirty is 1 + the highest block WriteData ever wrote: blocks at or above
	// it still read as zeros from the fresh file.
	dirty uint64
	done  bool
}

func openWriter(f *os.File, opts Options) (*Writer, error) {
	if f == nil {
		return nil, errors.New("new ext4 writer: nil file")
	}
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat image: %w", err)
	}
	if st.Size() != 0 {
		return nil, fmt.Errorf("new ext4 writer: image file is %d bytes, want an empty file", st.Size())
	}
	if len(opts.Label) > 16 {
		return nil, fmt.Errorf("new ext4 writer: label %q is longer than 16 bytes", opts.Label)
	}
	if opts.JournalBlocks != 0 && opts.JournalBlocks < minJournalBlocks {
		return nil, fmt.Errorf("new ext4 writer: journal of %d blocks is below the minimum of %d", opts.JournalBlocks, minJournalBlocks)
	}
	if opts.MaxSize < 0 {
		return nil, fmt.Errorf("new ext4 writer: negative MaxSize %d", opts.MaxSize)
	}
	if opts.MaxSize == 0 {
		opts.MaxSize = defaultMaxSize
	}
	if opts.MaxSize > maxMaxSize {
		return nil, fmt.Errorf("new ext4 writer: MaxSize %d is above the supported %d", opts.MaxSize, int64(maxMaxSize))
	}
	maxBlocks := uint64(opts.MaxSize) / BlockSize
	if maxBlocks < 1024 {
		return nil, fmt.Errorf("new ext4 writer: MaxSize %d is too small", opts.MaxSize)
	}
	maxGroups := ceilDiv(maxBlocks, blocksPerGroup)
	reserve := ceilDiv(maxGroups*descSize, BlockSize)
	return &Writer{
		f:          f,
		opts:       opts,
		maxBlocks:  maxBlocks,
		gdtReserve: reserve,
		alloc:      newAllocator(maxBlocks, 1+reserve),
		buf:        make([]byte, ioBufSize),
		q:          newWriteQueue(f, opts.BufferedData),
	}, nil
}

func ceilDiv(a, b uint64) uint64 { return (a + b - 1) / b }

// WriteData allocates blocks for size bytes read from r and writes them to
// the image. Whole zero blocks become holes. It fails if r yields fewer than
// size bytes.
func (w *Writer) WriteData(ctx context.Context, r io.Reader, size int64) (Data, error) {
	if size < 0 {
		return Data{}, fmt.Errorf("write data: negative size %d", size)
	}
	if uint64(size) > uint64(maxFileBlocks)*BlockSize {
		return Data{}, fmt.Errorf("write data: size %d exceeds the ext4 file size limit", size)
	}
	w.wmu.Lock()
	defer w.wmu.Unlock()
	if err := w.usable(); err != nil {
		return Data{}, fmt.Errorf("write data: %w", err)
	}
	var d Data
	fail := func(err error) (Data, error) {
		w.mu.Lock()
		w.release(d)
		w.mu.Unlock()
		return Data{}, err
	}
	var logical uint64
	for remaining := size; remaining > 0; {
		if err := ctx.Err(); err != nil {
			return fail(fmt.Errorf("write data: %w", err))
		}
		n := min(int64(len(w.buf)), remaining)
		got, err := io.ReadFull(r, w.buf[:n])
		if err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
				return fail(fmt.Errorf("read data: got %d of %d bytes: %w", size-remaining+int64(got), size, io.ErrUnexpectedEOF))
			}
			return fail(fmt.Errorf("read data: %w", err))
		}
		nb := ceilDiv(uint64(n), BlockSize)
		clear(w.buf[n : nb*BlockSize])
		w.mu.Lock()
		err = w.writeChunk(&d, logical, nb, remaining == n)
		w.mu.Unlock()
		if err != nil {
			return fail(err)
		}
		logical += nb
		remaining -= n
	}
	if len(d.extents) > 0 {
		d.owner = w
	}
	return d, nil
}

func (w *Writer) blk(i uint64) []byte { return w.buf[i*BlockSize : (i+1)*BlockSize] }

func isZero(b []byte) bool { return bytes.Equal(b, zeroBlock[:len(b)]) }

// usable reports why the writer cannot take more calls, if it cannot.
func (w *Writer) usable() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return ErrFinished
	}
	return w.q.failed()
}

// writeChunk stores the nb blocks staged in w.buf as logical blocks
// logical.., skipping all-zero blocks. The last block of a file (in the
// final chunk) is always stored: a file ending in a hole is valid ext4, but
// readers such as go-diskfs mishandle it, and it costs one block at most.
// w.mu is held.
func (w *Writer) writeChunk(d *Data, logical, nb uint64, final bool) error {
	hole := func(i uint64) bool { return isZero(w.blk(i)) && !(final && i == nb-1) }
	for i := uint64(0); i < nb; {
		if hole(i) {
			i++
			continue
		}
		j := i + 1
		for j < nb && !hole(j) {
			j++
		}
		runs, err := w.alloc.alloc(j - i)
		if err != nil {
			return fmt.Errorf("write data: %w", err)
		}
		for _, r := range runs {
			// Keep the blocks in d before writing so a failed write
			// releases them too.
			d.addRun(logical+i, r.start, r.count)
			if err := w.stage(r.start, w.buf[i*BlockSize:(i+r.count)*BlockSize]); err != nil {
				return err
			}
			i += r.count
		}
	}
	return nil
}

// stage copies data for blocks start.. into the current write job,
// handing full jobs to the queue. w.mu is held.
func (w *Writer) stage(start uint64, data []byte) error {
	if err := w.q.failed(); err != nil {
		return err
	}
	w.dirty = max(w.dirty, start+uint64(len(data)/BlockSize))
	for len(data) > 0 {
		if w.cur == nil {
			w.cur = &wjob{buf: w.q.buffer()}
		}
		j := w.cur
		room := cap(j.buf) - len(j.buf)
		if room == 0 {
			w.q.submit(j)
			w.cur = nil
			continue
		}
		n := min(room, len(data))
		off := len(j.buf)
		j.buf = append(j.buf, data[:n]...)
		if k := len(j.segs) - 1; k >= 0 && j.segs[k].off+j.segs[k].n == off &&
			j.segs[k].start+uint64(j.segs[k].n/BlockSize) == start {
			j.segs[k].n += n
		} else {
			j.segs = append(j.segs, wseg{start: start, off: off, n: n})
		}
		start += uint64(n / BlockSize)
		data = data[n:]
	}
	return nil
}

// errAborted fails the writes Abort skipped.
var errAborted = errors.New("ext4 writer aborted")

// Abort ends a writer whose image is abandoned (a failed build): the
// writes still queued are skipped and the one in progress, and the
// writeback hints, are waited for, so the file can be closed and removed
// at once and its space is given back. The writer is not usable after.
func (w *Writer) Abort() {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cur = nil
	w.q.abort(errAborted)
}

// flushPending submits the current job and waits until everything queued
// is on disk, returning the first write error. w.mu is held.
func (w *Writer) flushPending() error {
	if w.cur != nil && len(w.cur.buf) > 0 {
		w.q.submit(w.cur)
		w.cur = nil
	}
	return w.q.wait()
}

// addRun appends count blocks at physical start for logical block logical,
// merging with the previous extent where both ranges continue it.
func (d *Data) addRun(logical, start, count uint64) {
	d.blocks += count
	for count > 0 {
		if k := len(d.extents); k > 0 {
			last := &d.extents[k-1]
			if uint64(last.logical)+uint64(last.length) == logical &&
				last.physical+uint64(last.length) == start && last.length < maxExtentLen {
				n := min(count, uint64(maxExtentLen-last.length))
				last.length += uint32(n)
				logical += n
				start += n
				count -= n
				continue
			}
		}
		n := min(count, maxExtentLen)
		d.extents = append(d.extents, extent{logical: uint32(logical), length: uint32(n), physical: start})
		logical += n
		start += n
		count -= n
	}
}

// Release returns the blocks of content that is no longer referenced (an
// overwritten or deleted file) for reuse by later WriteData calls.
func (w *Writer) Release(d Data) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.release(d)
	}
}

func (w *Writer) release(d Data) {
	for _, e := range d.extents {
		w.alloc.release(e.physical, uint64(e.length))
	}
}

// OpenData reads back content written earlier (holes read as zeros).
func (w *Writer) OpenData(d Data, size int64) io.Reader {
	return &dataReader{w: w, ext: d.extents, size: max(size, 0)}
}

// dataReader reads a file's content back from the image, holes as zeros.
// It seeks, so that a reader of a large file starts where it needs to.
type dataReader struct {
	w    *Writer
	ext  []extent
	size int64
	pos  int64
	idx  int
}

// Seek implements io.Seeker.
func (r *dataReader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += r.pos
	case io.SeekEnd:
		offset += r.size
	default:
		return r.pos, fmt.Errorf("seek data: whence %d", whence)
	}
	if offset < 0 {
		return r.pos, fmt.Errorf("seek data: position %d", offset)
	}
	// Read finds the extent from the first one on.
	r.pos, r.idx = offset, 0
	return offset, nil
}

func (r *dataReader) Read(p []byte) (int, error) {
	if r.pos >= r.size {
		return 0, io.EOF
	}
	if int64(len(p)) > r.size-r.pos {
		p = p[:r.size-r.pos]
	}
	blk := uint64(r.pos / BlockSize)
	for r.idx < len(r.ext) && uint64(r.ext[r.idx].logical)+uint64(r.ext[r.idx].length) <= blk {
		r.idx++
	}
	if r.idx == len(r.ext) || uint64(r.ext[r.idx].logical) > blk {
		// In a hole: zeros up to the next extent or the end.
		end := r.size
		if r.idx < len(r.ext) {
			end = min(end, int64(r.ext[r.idx].logical)*BlockSize)
		}
		n := min(int64(len(p)), end-r.pos)
		clear(p[:n])
		r.pos += n
		return int(n), nil
	}
	e := r.ext[r.idx]
	off := r.pos - int64(e.logical)*BlockSize
	end := int64(e.length) * BlockSize
	n := min(int64(len(p)), end-off)
	r.w.mu.Lock()
	err := r.w.flushPending()
	r.w.mu.Unlock()
	if err != nil {
		return 0, fmt.Errorf("read data: %w", err)
	}
	m, err := r.w.f.ReadAt(p[:n], int64(e.physical)*BlockSize+off)
	r.pos += int64(m)
	if err != nil && !(errors.Is(err, io.EOF) && int64(m) == n) {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return m, fmt.Errorf("read data at block %d: %w", e.physical, err)
	}
	return m, nil
}
