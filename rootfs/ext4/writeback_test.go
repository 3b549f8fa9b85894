package ext4

import (
	"slices"
	"sync"
	"testing"
	"time"
)

func TestWritebackBatchesContiguousWrites(t *testing.T) {
	var mu sync.Mutex
	var got []span
	w := &writeback{sync: func(s span) {
		mu.Lock()
		got = append(got, s)
		mu.Unlock()
	}}
	const mib = 1 << 20
	// 8 MiB in 2 MiB pieces: one span.
	for i := range int64(4) {
		w.written(i*2*mib, 2*mib)
	}
	// A jump starts a new span; 6 MiB of it stays below the batch.
	w.written(100*mib, 6*mib)
	// Another jump drops those 6 MiB (left to the fsync) and a 9 MiB write
	// goes out alone.
	w.written(200*mib, 9*mib)
	want := []span{{0, 8 * mib}, {200 * mib, 9 * mib}}
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		done := len(got) >= len(want)
		mu.Unlock()
		if done || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, want) {
		t.Errorf("spans handed to writeback = %v, want %v", got, want)
	}
}

func TestWritebackDropsSpansBeyondTheBound(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	calls := 0
	w := &writeback{sync: func(span) {
		<-release
		mu.Lock()
		calls++
		mu.Unlock()
	}}
	// The first span blocks in sync; the next maxWritebackPending wait, the
	// rest are dropped instead of piling up.
	for i := range int64(maxWritebackPending + 10) {
		w.written(i*writebackBatch*2, writebackBatch)
	}
	close(release)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		w.mu.Lock()
		idle := !w.running
		w.mu.Unlock()
		if idle {
			break
		}
		time.Sleep(time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls < maxWritebackPending || calls > maxWritebackPending+1 {
		t.Errorf("%d spans handed over, want %d or %d", calls, maxWritebackPending, maxWritebackPending+1)
	}
}
