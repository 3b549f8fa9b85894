package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/artifacts"
	"github.com/cubesandbox/cubetemplatecenter/agent/masterdb"
)

// JobRows is what the agent needs of CubeMaster's database: the job row a
// build submit is checked against, and a probe for /health. *masterdb.DB is
// one.
type JobRows interface {
	JobForSubmit(ctx context.Context, jobID string) (masterdb.JobRow, error)
	Ping(ctx context.Context) error
}

// Database is what the agent needs of CubeMaster's database: the submit
// check, the build lock and READY rows shared with other replicas, and
// the artifact rows deletes claim. *masterdb.DB is one.
type Database interface {
	JobRows
	artifacts.Rows
}

var _ Database = (*masterdb.DB)(nil)

// checkJobRow binds a submit to CubeMaster's job row, when a database is
// configured: the row must exist and be PENDING or RUNNING (else 404), its
// request snapshot must be the submitted request (else 400), and a
// database that cannot be reached answers 503, which CubeMaster retries.
// It returns the status and message to answer with, or 0 to go on.
func (a *Agent) checkJobRow(ctx context.Context, b *api.Build) (int, string) {
	if a.db == nil {
		return 0, ""
	}
	log := a.logger.With("job_id", b.JobID)
	row, err := a.db.JobForSubmit(ctx, b.JobID)
	switch {
	case errors.Is(err, masterdb.ErrJobNotFound):
		log.Warn("build refused: no such job in CubeMaster's database")
		return http.StatusNotFound, "build job not found"
	case errors.Is(err, masterdb.ErrUnavailable):
		log.Warn("build refused: CubeMaster's database is unavailable", "err", err)
		return http.StatusServiceUnavailable, "CubeMaster's database is unavailable; retry later"
	case err != nil:
		log.Error("read job row", "err", err)
		return http.StatusInternalServerError, "check job row: " + err.Error()
	case !row.Buildable():
		log.Warn("build refused: job is not buildable", "status", row.Status)
		return http.StatusNotFound, fmt.Sprintf("build job not buildable: status is %q", row.Status)
	}
	same, err := row.MatchesRequest(b.Request)
	switch {
	case err != nil:
		log.Error("compare request with the job's snapshot", "err", err)
		return http.StatusInternalServerError, "check job row: " + err.Error()
	case !same:
		log.Warn("build refused: request does not match the job's stored request")
		return http.StatusBadRequest, "request does not match the job's stored request"
	}
	return 0, ""
}
