package health

import (
	"fmt"
	"sync"
	"time"
)

// Loops records when each of the agent's watched loops last went round:
// the process is alive while each goes round within its bound. It looks
// at nothing past the node, so an outage elsewhere never reads as a dead
// process.
type Loops struct {
	mu    sync.Mutex
	start time.Time
	last  map[string]time.Time
}

// Start marks the loops named as just started at now; a loop that has not
// gone round since counts from now.
func (l *Loops) Start(loops []string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.start = now
	for _, name := range loops {
		l.beat(name, now)
	}
}

// Beat records that loop went round at now.
func (l *Loops) Beat(loop string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.beat(loop, now)
}

func (l *Loops) beat(loop string, now time.Time) {
	if l.last == nil {
		l.last = map[string]time.Time{}
	}
	l.last[loop] = now
}

// Liveness returns, at now, how long ago each loop of bounds last went
// round, in seconds, and why each loop past its bound is stale. Before
// Start every loop counts as just started.
func (l *Loops) Liveness(now time.Time, bounds map[string]time.Duration) (ages map[string]float64, stale map[string]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	start := l.start
	if start.IsZero() {
		start = now
	}
	ages = map[string]float64{}
	for loop := range bounds {
		ages[loop] = now.Sub(lastRound(l.last, loop, start)).Seconds()
	}
	return ages, staleLoops(now, start, l.last, bounds)
}

// lastRound is when loop last went round; a loop that never did counts as
// going round at start.
func lastRound(last map[string]time.Time, loop string, start time.Time) time.Time {
	if at, ok := last[loop]; ok {
		return at
	}
	return start
}

// staleLoops returns, by loop, why each loop whose last round is older
// than its bound at now is stale.
func staleLoops(now, start time.Time, last map[string]time.Time, bounds map[string]time.Duration) map[string]string {
	stale := map[string]string{}
	for loop, bound := range bounds {
		if age := now.Sub(lastRound(last, loop, start)); age > bound {
			stale[loop] = fmt.Sprintf("%s loop has not gone round for %s (bound %s)", loop, age.Round(time.Second), bound)
		}
	}
	return stale
}
