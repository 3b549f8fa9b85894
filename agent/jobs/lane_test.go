package jobs

import (
	"slices"
	"sync"
	"testing"
)

// TestProgressLaneRunsInOrderAndDrainsOnClose: ops run one after the
// other in the order added, close returns once all have run, and an op
// added after close is dropped.
func TestProgressLaneRunsInOrderAndDrainsOnClose(t *testing.T) {
	l := newProgressLane()
	var mu sync.Mutex
	var ran []int
	hold := make(chan struct{})
	l.add(func() { <-hold })
	for i := range 100 {
		l.add(func() {
			mu.Lock()
			ran = append(ran, i)
			mu.Unlock()
		})
	}
	closed := make(chan struct{})
	go func() { l.close(); close(closed) }()
	close(hold)
	<-closed
	mu.Lock()
	got := slices.Clone(ran)
	mu.Unlock()
	if len(got) != 100 || !slices.IsSorted(got) {
		t.Fatalf("ran %v, want 0..99 in order, all before close returned", got)
	}
	l.add(func() {})
	l.mu.Lock()
	kept := len(l.ops)
	l.mu.Unlock()
	if kept != 0 {
		t.Errorf("%d ops kept after close, want the late one dropped", kept)
	}
	l.close() // again: returns at once
}

// TestProgressLaneFlush: flush returns once the ops added before it ran,
// and on a closed lane at once.
func TestProgressLaneFlush(t *testing.T) {
	l := newProgressLane()
	hold := make(chan struct{})
	var ran []int
	l.add(func() { <-hold; ran = append(ran, 1) })
	l.add(func() { ran = append(ran, 2) })
	flushed := make(chan struct{})
	go func() { l.flush(); close(flushed) }()
	select {
	case <-flushed:
		t.Fatal("flush returned before the ops added before it ran")
	default:
	}
	close(hold)
	<-flushed
	if !slices.Equal(ran, []int{1, 2}) {
		t.Errorf("ran %v at flush, want [1 2]", ran)
	}
	l.close()
	l.flush()
}
