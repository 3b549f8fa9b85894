package blobcache

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// patterned returns n bytes that differ at every offset of a chunk, so a
// byte written at the wrong place shows.
func patterned(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}

// TestPartialWriteAtOutOfOrder writes a blob's pieces back to front: the
// follower gets nothing until the first piece lands, then the whole
// prefix at once, and Commit accepts the digest of the whole.
func TestPartialWriteAtOutOfOrder(t *testing.T) {
	dir := t.TempDir()
	c := newTestCache(t, Options{Dir: dir})
	blob := patterned(3<<20 + 123)
	p, wait := createFollowed(t, c, sum(blob), int64(len(blob)))
	const piece = 1 << 20
	var offs []int
	for off := 0; off < len(blob); off += piece {
		offs = append(offs, off)
	}
	slices.Reverse(offs)
	for _, off := range offs[:len(offs)-1] {
		if _, err := p.WriteAt(blob[off:min(off+piece, len(blob))], int64(off)); err != nil {
			t.Fatal(err)
		}
		if p.Written() != 0 {
			t.Fatalf("prefix %d while the first piece is missing", p.Written())
		}
	}
	if got, want := p.Received(), int64(len(blob)-piece); got != want {
		t.Fatalf("Received = %d, want %d", got, want)
	}
	if m := p.Missing(); len(m) != 1 || m[0] != (Range{0, piece}) {
		t.Fatalf("Missing = %v, want [{0 %d}]", m, piece)
	}
	if _, err := p.WriteAt(blob[:piece], 0); err != nil {
		t.Fatal(err)
	}
	if p.Written() != int64(len(blob)) {
		t.Fatalf("prefix %d after the first piece, want all %d", p.Written(), len(blob))
	}
	if err := p.Commit(); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	if got, err := wait(); err != nil || !bytes.Equal(got, blob) {
		t.Fatalf("follower read %d bytes, error %v; want the %d written", len(got), err, len(blob))
	}
}

// TestPartialWriteAtOverlap refuses bytes written twice, in the prefix or
// ahead of it, and bytes past the size, leaving the Partial as it was.
func TestPartialWriteAtOverlap(t *testing.T) {
	c := newTestCache(t, Options{})
	blob := patterned(1000)
	p, err := c.Create(sum(blob), int64(len(blob)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Abort(nil)
	if _, err := p.WriteAt(blob[:100], 0); err != nil {
		t.Fatal(err)
	}
	if _, err := p.WriteAt(blob[500:600], 500); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ off, n int }{{50, 10}, {90, 20}, {550, 10}, {450, 100}, {590, 20}} {
		if _, err := p.WriteAt(blob[tc.off:tc.off+tc.n], int64(tc.off)); err == nil {
			t.Errorf("WriteAt(%d bytes at %d) over written bytes succeeded", tc.n, tc.off)
		}
	}
	if _, err := p.WriteAt(make([]byte, 10), 995); !errors.Is(err, ErrDigestMismatch) {
		t.Errorf("WriteAt past the size: %v, want ErrDigestMismatch", err)
	}
	if p.Written() != 100 || p.Received() != 200 {
		t.Fatalf("Written %d, Received %d after refused writes; want 100, 200", p.Written(), p.Received())
	}
	want := []Range{{100, 500}, {600, 1000}}
	if m := p.Missing(); !slices.Equal(m, want) {
		t.Fatalf("Missing = %v, want %v", m, want)
	}
}

// TestPartialWriteAtConcurrent has several writers put random pieces of
// a blob in random order while two readers follow it: both read it whole,
// and the digest of the pieces as they landed is the blob's.
func TestPartialWriteAtConcurrent(t *testing.T) {
	c := newTestCache(t, Options{})
	blob := patterned(6<<20 + 4321)
	p, err := c.Create(sum(blob), int64(len(blob)))
	if err != nil {
		t.Fatal(err)
	}
	var readers []func() ([]byte, error)
	for range 2 {
		r, err := p.NewReader(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		readers = append(readers, followWithin(t, r))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var pieces []Range
	for off := int64(0); off < int64(len(blob)); {
		n := min(int64(1+rng.IntN(300<<10)), int64(len(blob))-off)
		pieces = append(pieces, Range{off, off + n})
		off += n
	}
	rng.Shuffle(len(pieces), func(i, j int) { pieces[i], pieces[j] = pieces[j], pieces[i] })
	work := make(chan Range)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range work {
				if _, err := p.WriteAt(blob[r.Off:r.End], r.Off); err != nil {
					t.Errorf("WriteAt %v: %v", r, err)
				}
			}
		}()
	}
	for _, r := range pieces {
		work <- r
	}
	close(work)
	wg.Wait()
	if err := p.Commit(); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	for i, wait := range readers {
		if got, err := wait(); err != nil || !bytes.Equal(got, blob) {
			t.Fatalf("reader %d read %d bytes (equal %v), error %v", i, len(got), bytes.Equal(got, blob), err)
		}
	}
}

// TestPartialWriteAtMismatch lands a changed piece ahead of the prefix:
// the follower gets the mismatch instead of the end, and nothing is left
// in the cache.
func TestPartialWriteAtMismatch(t *testing.T) {
	dir := t.TempDir()
	c := newTestCache(t, Options{Dir: dir})
	blob := patterned(2 << 20)
	p, wait := createFollowed(t, c, sum(blob), int64(len(blob)))
	bad := bytes.Clone(blob[1<<20:])
	bad[10] ^= 0xff
	if _, err := p.WriteAt(bad, 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := p.WriteAt(blob[:1<<20], 0); err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("Commit: %v, want ErrDigestMismatch", err)
	}
	if got, err := wait(); !errors.Is(err, ErrAborted) || !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("follower: %d bytes, error %v; want ErrAborted and ErrDigestMismatch", len(got), err)
	}
	if blobs, temps := cacheFiles(t, dir); len(blobs)+len(temps) != 0 {
		t.Errorf("cache holds %v and %v after a mismatch", blobs, temps)
	}
}

// TestPartialCommitIncomplete refuses a blob with a hole.
func TestPartialCommitIncomplete(t *testing.T) {
	dir := t.TempDir()
	c := newTestCache(t, Options{Dir: dir})
	blob := patterned(4096)
	p, err := c.Create(sum(blob), int64(len(blob)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.WriteAt(blob[2048:], 2048); err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("Commit with a hole: %v, want ErrDigestMismatch", err)
	}
	if blobs, temps := cacheFiles(t, dir); len(blobs)+len(temps) != 0 {
		t.Errorf("cache holds %v and %v after a refused commit", blobs, temps)
	}
}

// TestFillAt copies a range and reports a short reader.
func TestFillAt(t *testing.T) {
	c := newTestCache(t, Options{})
	blob := patterned(3 << 20)
	p, err := c.Create(sum(blob), int64(len(blob)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Abort(nil)
	var reported int64
	n, err := c.FillAt(context.Background(), p, bytes.NewReader(blob[1<<20:]), 1<<20, 1<<20, func(w int) { reported += int64(w) })
	if err != nil || n != 1<<20 || reported != n {
		t.Fatalf("FillAt = %d, %v (reported %d); want %d", n, err, reported, 1<<20)
	}
	n, err = c.FillAt(context.Background(), p, bytes.NewReader(blob[2<<20:2<<20+10]), 2<<20, 1<<20, nil)
	if err != io.EOF || n != 10 {
		t.Fatalf("FillAt of a short reader = %d, %v; want 10, io.EOF", n, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	<-ctx.Done()
	if _, err := c.FillAt(ctx, p, bytes.NewReader(blob), 0, 1<<20, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("FillAt after the context ended: %v", err)
	}
}

// TestRangeSet checks Add, Remove, Overlaps, Next, Bytes and Gaps against
// a byte map.
func TestRangeSet(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		const size = 64
		var s RangeSet
		var have [size]bool
		for range rng.IntN(16) {
			off := rng.IntN(size)
			end := off + rng.IntN(size-off+1)
			remove := rng.IntN(3) == 0
			if remove {
				s.Remove(Range{int64(off), int64(end)})
			} else {
				s.Add(Range{int64(off), int64(end)})
			}
			for i := off; i < end; i++ {
				have[i] = !remove
			}
		}
		for i := 1; i < len(s); i++ {
			if s[i-1].End >= s[i].Off {
				t.Fatalf("ranges %v not disjoint and apart", s)
			}
		}
		for _, r := range s {
			if r.Len() <= 0 {
				t.Fatalf("empty range in %v", s)
			}
		}
		var held int64
		for i := range size {
			r := Range{int64(i), int64(i + 1)}
			if s.Overlaps(r) != have[i] {
				t.Fatalf("set %v: byte %d held %v, Overlaps says %v", s, i, have[i], s.Overlaps(r))
			}
			next, ok := s.Next(int64(i))
			want := -1
			for j := i; j < size; j++ {
				if have[j] {
					want = j
					break
				}
			}
			if ok != (want >= 0) || ok && next != int64(want) {
				t.Fatalf("set %v: Next(%d) = %d, %v; want %d", s, i, next, ok, want)
			}
			if have[i] {
				held++
			}
		}
		if s.Bytes() != held {
			t.Fatalf("set %v: Bytes() = %d, want %d", s, s.Bytes(), held)
		}
		var gapBytes [size]bool
		for _, g := range s.Gaps(0, size) {
			if g.Len() <= 0 {
				t.Fatalf("empty gap %v of %v", g, s)
			}
			for i := g.Off; i < g.End; i++ {
				gapBytes[i] = true
			}
		}
		for i := range size {
			if gapBytes[i] == have[i] {
				t.Fatalf("set %v: byte %d held %v and in a gap %v", s, i, have[i], gapBytes[i])
			}
		}
	}
}
