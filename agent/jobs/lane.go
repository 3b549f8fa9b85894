package jobs

import (
	"slices"
	"sync"
)

// progressLane commits one job's progress (phase and pull reports,
// heartbeats, the fingerprint report) in the order it was recorded, on a
// goroutine of its own: the build goes on while they commit, instead of
// waiting for each at every step. The job's terminal state is committed
// only once the lane is drained (close), so every progress report is
// queued before the terminal one.
//
// Its queue is bounded by what a job records, not by how long the spool
// takes: a heartbeat or pull report that is still queued when the next of
// its kind comes is dropped for it (the newer one carries the later
// state), so a spool that stalls holds at most one of each, behind the
// reports that are never superseded (a phase, the fingerprint).
type progressLane struct {
	mu     sync.Mutex
	ops    []laneOp
	closed bool
	// wake has a token while ops holds work the runner has not seen.
	wake chan struct{}
	done chan struct{}
}

// laneKey names a kind of op whose newer instance supersedes a queued one;
// ops with keyOrdered are never superseded.
type laneKey int

const (
	keyOrdered laneKey = iota
	keyHeartbeat
	keyPull
)

type laneOp struct {
	key laneKey
	run func()
}

func newProgressLane() *progressLane {
	l := &progressLane{wake: make(chan struct{}, 1), done: make(chan struct{})}
	go l.run()
	return l
}

// add queues op after the ops added before it; with a key other than
// keyOrdered, a queued op of the same key that has not started is dropped
// first. Once the lane is closed (the job ended) op is dropped: a finished
// job takes no more progress. It never blocks.
func (l *progressLane) add(key laneKey, op func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	if key != keyOrdered {
		l.ops = slices.DeleteFunc(l.ops, func(o laneOp) bool { return o.key == key })
	}
	l.ops = append(l.ops, laneOp{key, op})
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// flush returns once every op added before it has run.
func (l *progressLane) flush() {
	ran := make(chan struct{})
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		<-l.done
		return
	}
	l.add(keyOrdered, func() { close(ran) })
	select {
	case <-ran:
	case <-l.done: // closed meanwhile: everything ran
	}
}

// close runs what was added and returns once it has run; later adds are
// dropped. Calling it again waits the same way.
func (l *progressLane) close() {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
	l.mu.Unlock()
	<-l.done
}

func (l *progressLane) run() {
	defer close(l.done)
	for range l.wake {
		for {
			l.mu.Lock()
			ops, closed := l.ops, l.closed
			l.ops = nil
			l.mu.Unlock()
			for _, op := range ops {
				op.run()
			}
			if len(ops) == 0 {
				if closed {
					return
				}
				break
			}
		}
	}
}
