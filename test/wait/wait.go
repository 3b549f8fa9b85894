// Package wait is how the project's tests wait for something to happen:
// polling a condition with one bound, so a hang fails the test that waits
// rather than the suite's timeout.
package wait

import (
	"testing"
	"time"
)

// Limit bounds a wait for something that takes milliseconds when the code
// is right: long enough for a loaded two-core machine.
const Limit = 30 * time.Second

// pollEvery is the pause between two looks at a condition.
const pollEvery = 20 * time.Millisecond

// For polls cond until it holds, failing tb after Limit.
func For(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	Until(tb, Limit, what, func() (bool, string) { return cond(), "" })
}

// Until polls cond until it holds, failing tb after within with what and
// cond's last word on the state.
func Until(tb testing.TB, within time.Duration, what string, cond func() (bool, string)) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			if state != "" {
				tb.Fatalf("waited %s for %s; last state: %s", within, what, state)
			}
			tb.Fatalf("waited %s for %s", within, what)
		}
		time.Sleep(pollEvery)
	}
}
