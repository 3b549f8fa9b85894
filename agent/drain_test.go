package agent

import (
	"testing"
	"time"
)

func TestDrainBudget(t *testing.T) {
	for _, c := range []struct{ timeout, reserve, want time.Duration }{
		{25 * time.Second, 5 * time.Second, 20 * time.Second},
		{55 * time.Second, 5 * time.Second, 50 * time.Second},
		{6 * time.Second, 5 * time.Second, 3 * time.Second}, // at least half
		{10 * time.Second, 0, 10 * time.Second},
	} {
		if got := drainBudget(c.timeout, c.reserve); got != c.want {
			t.Errorf("drainBudget(%s, %s) = %s, want %s", c.timeout, c.reserve, got, c.want)
		}
	}
}
