package jobs

import (
	"fmt"
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
	l.add(keyOrdered, func() { <-hold })
	for i := range 100 {
		l.add(keyOrdered, func() {
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
	l.add(keyOrdered, func() {})
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
	l.add(keyOrdered, func() { <-hold; ran = append(ran, 1) })
	l.add(keyOrdered, func() { ran = append(ran, 2) })
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

// TestProgressLaneSupersedesHeartbeatsAndPulls: while the lane is held (a
// spool that stalls), heartbeats and pull reports replace their queued
// predecessor instead of piling up; ordered ops all stay, in order, and
// the newest heartbeat and pull run after the ordered ops queued before
// them.
func TestProgressLaneSupersedesHeartbeatsAndPulls(t *testing.T) {
	l := newProgressLane()
	hold := make(chan struct{})
	started := make(chan struct{})
	l.add(keyOrdered, func() { close(started); <-hold })
	<-started
	var ran []string
	record := func(s string) func() { return func() { ran = append(ran, s) } }
	for i := range 10000 {
		if i%2500 == 0 {
			l.add(keyOrdered, record(fmt.Sprintf("phase%d", i/2500)))
		}
		l.add(keyHeartbeat, record(fmt.Sprintf("heartbeat%d", i)))
		l.add(keyPull, record(fmt.Sprintf("pull%d", i)))
	}
	l.mu.Lock()
	queued := len(l.ops)
	l.mu.Unlock()
	if queued != 6 {
		t.Errorf("%d ops queued after 20,004 adds, want 6 (4 phases, one heartbeat, one pull)", queued)
	}
	close(hold)
	l.close()
	want := []string{"phase0", "phase1", "phase2", "phase3", "heartbeat9999", "pull9999"}
	if !slices.Equal(ran, want) {
		t.Errorf("ran %v, want %v", ran, want)
	}
}
