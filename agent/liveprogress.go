package agent

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
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

// OpenLiveProgress opens the publisher of live pull progress to
// CubeMaster's Redis as redis: names it, or returns nil when none is
// configured. It does not connect: Redis being down never stops TC.
func OpenLiveProgress(cfg *config.Config, logger *slog.Logger) (*liveprogress.Publisher, error) {
	r := cfg.Redis
	if !r.Enabled() {
		return nil, nil
	}
	tlsConfig, err := r.TLS.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	return liveprogress.New(liveprogress.Options{Nodes: r.Nodes, Password: r.Password.Reveal(), DB: r.DBNo, TLS: tlsConfig},
		logger.With("component", "liveprogress"))
}
