package blobcache

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestStatsCountHitsAndMisses: a first fetch misses every layer, a second
// hits every one, a cache reopened on the same files hits them too (the
// file is verified, not fetched), and concurrent fetches of one blob make
// one download, counted as misses for each caller.
func TestStatsCountHitsAndMisses(t *testing.T) {
	dir := t.TempDir()
	o, img := servedImage(t, 3, 64<<10)
	c := newTestCache(t, Options{Dir: dir})

	fetchImage(t, c, o, img).Close()
	if st := c.Stats(); st.Hits != 0 || st.Misses != 3 {
		t.Fatalf("after the first fetch: Stats() hits %d misses %d, want 0 and 3", st.Hits, st.Misses)
	}
	fetchImage(t, c, o, img).Close()
	if st := c.Stats(); st.Hits != 3 || st.Misses != 3 {
		t.Fatalf("after a second fetch: Stats() hits %d misses %d, want 3 and 3", st.Hits, st.Misses)
	}
	if got := o.layerGets(img); got != 3 {
		t.Fatalf("origin served %d layers, want 3", got)
	}
	c.Close()

	reopened := newTestCache(t, Options{Dir: dir})
	fetchImage(t, reopened, o, img).Close()
	if st := reopened.Stats(); st.Hits != 3 || st.Misses != 0 {
		t.Fatalf("reopened cache: Stats() hits %d misses %d, want 3 and 0", st.Hits, st.Misses)
	}

	// Concurrent acquirers of a new blob: the download is held until all
	// are inside Acquire, so the others wait for it.
	o2, img2 := servedImage(t, 1, 64<<10)
	l := img2[0]
	c2 := newTestCache(t, Options{})
	const callers = 3
	allIn := func() bool {
		c2.mu.Lock()
		defer c2.mu.Unlock()
		return c2.users == callers
	}
	var done sync.WaitGroup
	for range callers {
		done.Go(func() {
			_, err := c2.Acquire(context.Background(), l.hex, int64(len(l.blob)), "origin", func(ctx context.Context) error {
				for !allIn() {
					time.Sleep(time.Millisecond)
				}
				r, err := o2.open(l.hex)
				if err != nil {
					return err
				}
				return put(ctx, c2, l.hex, int64(len(l.blob)), r)
			})
			if err != nil {
				t.Errorf("Acquire: %v", err)
				return
			}
			c2.Release([]string{l.hex})
		})
	}
	done.Wait()
	if st := c2.Stats(); st.Hits != 0 || st.Misses != callers {
		t.Fatalf("concurrent first fetches: Stats() hits %d misses %d, want 0 and %d", st.Hits, st.Misses, callers)
	}
	if got := o2.layerGets(img2); got != 1 {
		t.Fatalf("origin served the blob %d times, want 1", got)
	}
}
