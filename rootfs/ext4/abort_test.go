package ext4

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestAbortWaitsForWritesAndHints: Abort returns only once no write of the
// queue and no writeback hint is in progress, so the caller may close and
// remove the image at once; later writes fail.
func TestAbortWaitsForWritesAndHints(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "image.ext4"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	opts := testOptions()
	opts.BufferedData = true // hints follow buffered writes only
	w, err := NewWriter(f, opts)
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var finished atomic.Bool
	w.q.wb.sync = func(span) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
		finished.Store(true)
	}
	const n = 64 << 20
	if _, err := w.WriteData(context.Background(), &repeatReader{pat: []byte("abcdefgh"), n: n}, n); err != nil {
		t.Fatal(err)
	}
	<-entered // a hint is in progress, blocked
	go func() {
		// Release the hint once Abort has begun (it dropped the spans
		// not handed over): Abort must then still wait for it.
		for {
			w.q.wb.mu.Lock()
			started := w.q.wb.pending == nil
			w.q.wb.mu.Unlock()
			if started {
				break
			}
			time.Sleep(time.Millisecond)
		}
		close(release)
	}()
	w.Abort()
	if !finished.Load() {
		t.Error("Abort returned while a writeback hint was still using the file")
	}
	w.q.mu.Lock()
	running := w.q.running
	w.q.mu.Unlock()
	if running {
		t.Error("Abort returned while the write queue was running")
	}
	if _, err := w.WriteData(context.Background(), strings.NewReader("x"), 1); !errors.Is(err, errAborted) {
		t.Errorf("WriteData after Abort = %v, want errAborted", err)
	}
}
