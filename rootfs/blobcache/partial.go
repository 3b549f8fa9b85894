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
// download brings, NewReader follows the bytes written so far while more
// arrive, Commit checks size and sha256 and enters the blob under its name,
// Abort drops it. The file only grows: a download that starts over skips
// what the Partial already holds instead of rewriting it, so a reader never
// sees a byte change under it, and the digest checked at Commit is the
// digest of exactly the bytes every reader was given. Its methods are safe
// for concurrent use; Write and Commit come from one writer.
type Partial struct {
	c    *Cache
	hex  string
	size int64
	f    *os.File
	h    hash.Hash

	mu      sync.Mutex
	written int64
	// moved is closed, and replaced, whenever written grows or the Partial
	// ends, waking the readers waiting for either.
	moved     chan struct{}
	ended     bool
	committed bool
	err       error // why the Partial ended without a commit
}

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

// Written returns how many bytes the Partial holds: where a resumed
// download continues.
func (p *Partial) Written() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.written
}

// Write appends b. Bytes beyond the blob's size are refused with
// ErrDigestMismatch, before any of them is written.
func (p *Partial) Write(b []byte) (int, error) {
	p.mu.Lock()
	ended, w := p.ended, p.written
	p.mu.Unlock()
	if ended {
		return 0, errors.New("write blob: already ended")
	}
	if w+int64(len(b)) > p.size {
		return 0, fmt.Errorf("%w: expected %d bytes, got more", ErrDigestMismatch, p.size)
	}
	n, err := p.f.Write(b)
	p.h.Write(b[:n])
	p.mu.Lock()
	p.written += int64(n)
	if n > 0 {
		p.wakeLocked()
	}
	p.mu.Unlock()
	if err != nil {
		return n, fmt.Errorf("write temp blob: %w", err)
	}
	return n, nil
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
	w := p.written
	p.mu.Unlock()
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
