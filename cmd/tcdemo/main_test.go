package main

import (
	"strings"
	"testing"
)

// TestDemoNoticesAgentExit: an agent that exits before it answers /health
// ends the demo with an error saying so and naming its log (the wait used
// to run out its minute and report no answer).
func TestDemoNoticesAgentExit(t *testing.T) {
	err := run("/bin/false", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "exited before answering") || !strings.Contains(err.Error(), "agent.log") {
		t.Fatalf("run with an agent that exits = %v, want it to say the agent exited and name its log", err)
	}
}
