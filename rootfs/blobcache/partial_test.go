package blobcache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"testing"
	"time"
)

// followWithin reads r to its end in the background and returns what it
// read and the error, or fails the test when that takes past the bound.
func followWithin(t *testing.T, r io.Reader) func() ([]byte, error) {
	t.Helper()
	type result struct {
		b   []byte
		err error
	}
	ch := make(chan result, 1)
	go func() { b, err := io.ReadAll(r); ch <- result{b, err} }()
	return func() ([]byte, error) {
		t.Helper()
		select {
		case res := <-ch:
			return res.b, res.err
		case <-time.After(10 * time.Second):
			t.Fatal("the reader did not end")
			return nil, nil
		}
	}
}

// createFollowed creates blob hexDigest and a reader following it from
// the start, as followWithin.
func createFollowed(t *testing.T, c *Cache, hexDigest string, size int64) (*Partial, func() ([]byte, error)) {
	t.Helper()
	p, err := c.Create(hexDigest, size)
	if err != nil {
		t.Fatal(err)
	}
	r, err := p.NewReader(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return p, followWithin(t, r)
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestPartialFollow writes a blob in pieces while a reader follows it from
// the start, and another starts after the commit: both read it whole.
func TestPartialFollow(t *testing.T) {
	dir := t.TempDir()
	c := newTestCache(t, Options{Dir: dir})
	blob := bytes.Repeat([]byte("layer bytes "), 10000)
	p, wait := createFollowed(t, c, sum(blob), int64(len(blob)))
	for off := 0; off < len(blob); off += 7000 {
		if _, err := p.Write(blob[off:min(off+7000, len(blob))]); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	if err := p.Commit(); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	if got, err := wait(); err != nil || !bytes.Equal(got, blob) {
		t.Fatalf("follower read %d bytes, error %v; want the %d written", len(got), err, len(blob))
	}
	late, err := p.NewReader(context.Background())
	if err != nil {
		t.Fatalf("NewReader after Commit: %v", err)
	}
	defer late.Close()
	if got, err := io.ReadAll(late); err != nil || !bytes.Equal(got, blob) {
		t.Fatalf("late reader read %d bytes, error %v", len(got), err)
	}
	if !exists(t, blobPath(dir, sum(blob))) {
		t.Error("the committed blob is not under its name")
	}
}

// TestPartialMismatch commits a blob whose bytes do not hash to its name:
// the follower gets the mismatch after the bytes, and nothing is left.
func TestPartialMismatch(t *testing.T) {
	dir := t.TempDir()
	c := newTestCache(t, Options{Dir: dir})
	blob := bytes.Repeat([]byte("x"), 5000)
	p, wait := createFollowed(t, c, sum([]byte("something else")), int64(len(blob)))
	if _, err := p.Write(blob); err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("Commit: %v, want ErrDigestMismatch", err)
	}
	if _, err := wait(); !errors.Is(err, ErrAborted) || !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("follower error = %v, want ErrAborted and ErrDigestMismatch", err)
	}
	if blobs, temps := cacheFiles(t, dir); len(blobs)+len(temps) != 0 {
		t.Errorf("cache holds %v and %v after a mismatch", blobs, temps)
	}
	if _, err := p.NewReader(context.Background()); !errors.Is(err, ErrAborted) {
		t.Errorf("NewReader after the abort: %v, want ErrAborted", err)
	}
}

// TestPartialLimits refuses bytes past the size before writing them, and
// ends a follower's wait with its context.
func TestPartialLimits(t *testing.T) {
	c := newTestCache(t, Options{})
	p, err := c.Create(sum([]byte("abc")), 3)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Abort(nil)
	if _, err := p.Write([]byte("abcd")); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("Write past the size: %v, want ErrDigestMismatch", err)
	}
	if p.Written() != 0 {
		t.Fatalf("Written = %d after a refused write", p.Written())
	}
	ctx, cancel := context.WithCancel(context.Background())
	r, err := p.NewReader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	wait := followWithin(t, r)
	cancel()
	if _, err := wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("follower error = %v, want context.Canceled", err)
	}
}
