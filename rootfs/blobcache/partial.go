package blobcache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"sync"
)

// Partial is a blob being written into the cache: Write appends what a
// download brings, WriteAt puts bytes at their offset (several downloads of
// one blob's ranges at once), NewReader follows the contiguous prefix
// written so far while more arrives, Commit checks size and sha256 and
// enters the blob under its name, Abort drops it. Each byte is written
// once: a write overlapping bytes written or being written is refused, so
// a reader never sees a byte change under it, and the digest checked at
// Commit is the digest of exactly the bytes every reader was given. Bytes
// written ahead of the prefix wait in the file (which may have holes until
// the end) and are hashed, read back from the page cache, when the prefix
// reaches them. Its methods are safe for concurrent use; Commit comes once
// every write returned.
type Partial struct {
	c    *Cache
	hex  string
	size int64
	f    *os.File
	// h hashes the prefix; only the one writer advancing it (hashing)
	// touches it, and Commit once the writes are done.
	h    hash.Hash
	hbuf []byte // read-back buffer of the writer advancing the prefix

	mu sync.Mutex
	// written is the contiguous, hashed prefix: what readers may read.
	written int64
	// held lists the bytes written past the prefix; writing the ranges
	// being written now. Neither may be written again.
	held     RangeSet
	writing  []Range
	received int64
	// hashing tells that a writer is advancing the prefix over held.
	hashing bool
	// moved is closed, and replaced, whenever written grows or the Partial
	// ends, waking the readers waiting for either.
	moved     chan struct{}
	ended     bool
	committed bool
	err       error // why the Partial ended without a commit
}

// readBackSize is the buffer that hashes bytes written ahead of the prefix.
const readBackSize = 256 << 10

// ErrAborted marks a read from a Partial that ended without a commit; the
// download's own error follows it in the chain.
var ErrAborted = errors.New("download did not complete")

// Create starts blob hexDigest of size bytes as a temp file beside its
// final name. The caller ends it with Commit or Abort.
func (c *Cache) Create(hexDigest string, size int64) (*Partial, error) {
	if !IsHex64(hexDigest) || size < 0 {
		return nil, fmt.Errorf("create blob %q of %d bytes: invalid digest or size", hexDigest, size)
	}
	f, err := os.CreateTemp(c.dir, tmpPrefix+hexDigest+"-*")
	if err != nil {
		return nil, fmt.Errorf("create temp blob: %w", err)
	}
	return &Partial{c: c, hex: hexDigest, size: size, f: f, h: sha256.New(), moved: make(chan struct{})}, nil
}

// Size returns the size the blob must have.
func (p *Partial) Size() int64 { return p.size }

// Written returns the length of the contiguous prefix the Partial holds:
// what readers can read, and where Write appends.
func (p *Partial) Written() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.written
}

// Received returns how many bytes the Partial holds, in the prefix and
// ahead of it.
func (p *Partial) Received() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.received
}

// Missing lists the ranges of the blob neither written nor being written,
// in order.
func (p *Partial) Missing() RangeSet {
	p.mu.Lock()
	defer p.mu.Unlock()
	taken := append(RangeSet(nil), p.held...)
	for _, r := range p.writing {
		taken.Add(r)
	}
	return taken.Gaps(p.written, p.size)
}

// Write appends b at the end of the prefix. Bytes beyond the blob's size
// are refused with ErrDigestMismatch, before any of them is written.
func (p *Partial) Write(b []byte) (int, error) {
	return p.WriteAt(b, p.Written())
}

// WriteAt writes b at offset off. Bytes beyond the blob's size are refused
// with ErrDigestMismatch, and bytes already written or being written with
// another error, before any of them is written. A write that completes
// the prefix up to bytes written ahead of it also hashes those.
func (p *Partial) WriteAt(b []byte, off int64) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	r := Range{off, off + int64(len(b))}
	p.mu.Lock()
	switch {
	case p.ended:
		p.mu.Unlock()
		return 0, errors.New("write blob: already ended")
	case off < 0 || r.End > p.size:
		p.mu.Unlock()
		return 0, fmt.Errorf("%w: expected %d bytes, got more", ErrDigestMismatch, p.size)
	case off < p.written || p.held.Overlaps(r) || overlapsAny(p.writing, r):
		p.mu.Unlock()
		return 0, fmt.Errorf("write blob: bytes %d-%d were already written", r.Off, r.End-1)
	}
	p.writing = append(p.writing, r)
	p.mu.Unlock()

	n, werr := p.f.WriteAt(b, off)

	p.mu.Lock()
	for i, w := range p.writing {
		if w == r {
			p.writing = append(p.writing[:i], p.writing[i+1:]...)
			break
		}
	}
	if n > 0 {
		p.held.Add(Range{off, off + int64(n)})
		p.received += int64(n)
	}
	lead := !p.hashing && !p.ended && len(p.held) > 0 && p.held[0].Off == p.written
	if lead {
		p.hashing = true
	}
	p.mu.Unlock()
	var herr error
	if lead {
		herr = p.advance(b[:n], off)
	}
	if werr != nil {
		return n, fmt.Errorf("write temp blob: %w", werr)
	}
	if herr != nil {
		return n, herr
	}
	return n, nil
}

func overlapsAny(rs []Range, r Range) bool {
	for _, w := range rs {
		if w.Off < r.End && r.Off < w.End {
			return true
		}
	}
	return false
}

// advance hashes held bytes from the prefix on and moves the prefix over
// them, waking readers, until the next held range does not start at the
// prefix. own, written at ownOff, is hashed from memory when the prefix
// reaches it; other bytes are read back from the file. Only the writer
// that set hashing runs it.
func (p *Partial) advance(own []byte, ownOff int64) error {
	for {
		p.mu.Lock()
		if p.ended || len(p.held) == 0 || p.held[0].Off != p.written {
			p.hashing = false
			p.mu.Unlock()
			return nil
		}
		r := p.held[0]
		p.mu.Unlock()
		if err := p.hashRange(r, own, ownOff); err != nil {
			p.mu.Lock()
			p.hashing = false
			p.mu.Unlock()
			return err
		}
		p.mu.Lock()
		p.written = r.End
		p.held.Remove(Range{0, r.End})
		p.wakeLocked()
		p.mu.Unlock()
	}
}

// hashRange adds the bytes of r to the digest: own where r starts with it,
// the rest read back from the file in readBackSize pieces.
func (p *Partial) hashRange(r Range, own []byte, ownOff int64) error {
	pos := r.Off
	if ownOff == pos && len(own) > 0 {
		n := min(int64(len(own)), r.Len())
		p.h.Write(own[:n])
		pos += n
	}
	if pos < r.End && p.hbuf == nil {
		p.hbuf = make([]byte, readBackSize)
	}
	for pos < r.End {
		b := p.hbuf[:min(int64(len(p.hbuf)), r.End-pos)]
		n, err := p.f.ReadAt(b, pos)
		p.h.Write(b[:n])
		pos += int64(n)
		if err != nil && pos < r.End {
			return fmt.Errorf("read back temp blob: %w", err)
		}
	}
	return nil
}

// wakeLocked wakes every reader waiting on the Partial.
func (p *Partial) wakeLocked() {
	close(p.moved)
	p.moved = make(chan struct{})
}

// Commit checks the size and sha256 of what was written and renames the
// file to the blob's name; the caller (Acquire's download) then has it
// pinned. On a mismatch the Partial is aborted with that error: readers
// that already read its bytes get it instead of the end of the stream.
func (p *Partial) Commit() error {
	p.mu.Lock()
	w, busy := p.written, p.hashing || len(p.writing) > 0
	p.mu.Unlock()
	if busy {
		err := errors.New("commit blob: writes still in progress")
		p.Abort(err)
		return err
	}
	var err error
	switch got := hex.EncodeToString(p.h.Sum(nil)); {
	case w != p.size:
		err = fmt.Errorf("%w: expected %d bytes, got %d", ErrDigestMismatch, p.size, w)
	case got != p.hex:
		err = fmt.Errorf("%w: expected sha256:%s, got sha256:%s", ErrDigestMismatch, p.hex, got)
	}
	if err != nil {
		p.Abort(err)
		return err
	}
	// No fsync: the blob is verified (size and sha256) before its first use
	// after every start, so a blob a crash left torn is re-fetched, and
	// syncing here would hold a cold build up for the disk.
	if err := p.f.Close(); err != nil {
		err = fmt.Errorf("close temp blob: %w", err)
		p.Abort(err)
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// Under the lock: a reader opening the temp name now would race the
	// rename; NewReader opens the final name once committed is set.
	if err := os.Rename(p.f.Name(), p.c.path(p.hex)); err != nil {
		err = fmt.Errorf("commit blob: %w", err)
		p.endLocked(err)
		os.Remove(p.f.Name())
		return err
	}
	p.ended, p.committed = true, true
	p.wakeLocked()
	return nil
}

// Abort ends the Partial without a commit and removes its file; readers
// get err (wrapped in ErrAborted) once they have read what was written.
// It does nothing after Commit or an earlier Abort.
func (p *Partial) Abort(err error) {
	if err == nil {
		err = errors.New("aborted")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return
	}
	p.endLocked(err)
	p.f.Close()
	os.Remove(p.f.Name())
}

func (p *Partial) endLocked(err error) {
	p.ended, p.err = true, err
	p.wakeLocked()
}

// NewReader returns a reader of the blob from its first byte that waits
// for bytes not yet written, until the Partial ends: after a Commit it
// reads to the end, after an Abort it fails with the abort's cause. A wait
// also ends with ctx. Close the reader when done.
func (p *Partial) NewReader(ctx context.Context) (io.ReadCloser, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended && !p.committed {
		return nil, fmt.Errorf("%w: %w", ErrAborted, p.err)
	}
	name := p.f.Name()
	if p.committed {
		name = p.c.path(p.hex)
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("open blob being written: %w", err)
	}
	return &partialReader{p: p, f: f, ctx: ctx}, nil
}

// partialReader reads a Partial's file at its own offset.
type partialReader struct {
	p   *Partial
	f   *os.File
	ctx context.Context
	off int64
}

func (r *partialReader) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	for {
		r.p.mu.Lock()
		avail, ended, committed, cause, moved := r.p.written-r.off, r.p.ended, r.p.committed, r.p.err, r.p.moved
		r.p.mu.Unlock()
		switch {
		case ended && !committed:
			return 0, fmt.Errorf("%w: %w", ErrAborted, cause)
		case avail > 0:
			n, err := r.f.ReadAt(b[:min(int64(len(b)), avail)], r.off)
			r.off += int64(n)
			if err == io.EOF && n > 0 {
				err = nil
			}
			if err != nil {
				return n, fmt.Errorf("read blob being written: %w", err)
			}
			return n, nil
		case ended:
			return 0, io.EOF
		}
		select {
		case <-moved:
		case <-r.ctx.Done():
			return 0, r.ctx.Err()
		}
	}
}

func (r *partialReader) Close() error { return r.f.Close() }
