package agent

import (
	"context"

	"github.com/cubesandbox/cubetemplatecenter/agent/jobs"
	"github.com/cubesandbox/cubetemplatecenter/agent/liveprogress"
)

// LiveProgress publishes jobs' pull progress where CubeMaster overlays it
// on job polls. It must never block: *liveprogress.Publisher is one.
type LiveProgress interface {
	jobs.LiveProgress
	// Ping checks the destination answers, for /health.
	Ping(ctx context.Context) error
}

var _ LiveProgress = (*liveprogress.Publisher)(nil)
