package health

import (
	"strings"
	"testing"
	"time"
)

func TestStaleLoops(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	bounds := map[string]time.Duration{"a": time.Minute, "b": 2 * time.Minute}
	cases := []struct {
		name  string
		now   time.Time
		last  map[string]time.Time
		stale []string
	}{
		{"Fresh", start.Add(time.Hour), map[string]time.Time{"a": start.Add(time.Hour - time.Second), "b": start.Add(time.Hour - time.Minute)}, nil},
		{"AtBound", start.Add(time.Hour), map[string]time.Time{"a": start.Add(time.Hour - time.Minute), "b": start.Add(time.Hour - 2*time.Minute)}, nil},
		{"OneStale", start.Add(time.Hour), map[string]time.Time{"a": start.Add(time.Hour - 61*time.Second), "b": start.Add(time.Hour)}, []string{"a"}},
		{"NeverBeatCountsFromStart", start.Add(90 * time.Second), map[string]time.Time{"b": start}, []string{"a"}},
		{"NeverBeatJustStarted", start.Add(time.Second), nil, nil},
		{"AllStale", start.Add(time.Hour), map[string]time.Time{"a": start, "b": start}, []string{"a", "b"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := staleLoops(c.now, start, c.last, bounds)
			if len(got) != len(c.stale) {
				t.Fatalf("staleLoops = %v, want stale %v", got, c.stale)
			}
			for _, l := range c.stale {
				if !strings.Contains(got[l], l+" loop has not gone round") {
					t.Errorf("staleLoops[%s] = %q", l, got[l])
				}
			}
		})
	}
}

// TestLiveness: ages count from each loop's last round, or from Start for
// a loop that has not gone round since; before Start nothing is stale.
func TestLiveness(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	bounds := map[string]time.Duration{"reporter": time.Minute, "status": time.Minute}
	var l Loops
	if ages, stale := l.Liveness(start, bounds); len(stale) != 0 || ages["reporter"] != 0 || len(ages) != 2 {
		t.Errorf("before Start: ages %v, stale %v; want both at 0, none stale", ages, stale)
	}
	l.Start([]string{"status"}, start)
	l.Beat("status", start.Add(90*time.Second))
	ages, stale := l.Liveness(start.Add(100*time.Second), bounds)
	if ages["status"] != 10 || ages["reporter"] != 100 {
		t.Errorf("ages = %v, want status 10 s and reporter 100 s (from Start)", ages)
	}
	if len(stale) != 1 || !strings.HasPrefix(stale["reporter"], "reporter loop has not gone round for 1m40s (bound 1m0s)") {
		t.Errorf("stale = %v, want reporter only", stale)
	}
}
