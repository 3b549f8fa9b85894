package agent

import (
	"context"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/liveprogress"
)

// LiveProgress publishes jobs' pull progress where CubeMaster overlays it
// on job polls. It must never block: *liveprogress.Publisher is one.
type LiveProgress interface {
	// Update records a job's latest pull progress.
	Update(jobID string, p api.Pull)
	// Finish sends the job's last progress and removes it.
	Finish(jobID string)
	// Ping checks the destination answers, for /health.
	Ping(ctx context.Context) error
}

var _ LiveProgress = (*liveprogress.Publisher)(nil)
