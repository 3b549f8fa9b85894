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
// It returns the status and message to answer with, or 0 to go on, and the
// error behind a refusal, for the log line of the rejected request.
func (a *Agent) checkJobRow(ctx context.Context, b *api.Build) (int, string, error) {
	if a.db == nil {
		return 0, "", nil
	}
	log := a.logger.With("job_id", b.JobID)
	row, err := a.db.JobForSubmit(ctx, b.JobID)
	switch {
	case errors.Is(err, masterdb.ErrJobNotFound):
		return http.StatusNotFound, "build job not found", nil
	case errors.Is(err, masterdb.ErrUnavailable):
		return http.StatusServiceUnavailable, "CubeMaster's database is unavailable; retry later", err
	case err != nil:
		log.Error("read job row", "err", err)
		return http.StatusInternalServerError, "check job row: " + err.Error(), err
	case !row.Buildable():
		return http.StatusNotFound, fmt.Sprintf("build job not buildable: status is %q", row.Status), nil
	}
	same, err := row.MatchesRequest(b.Request)
	switch {
	case err != nil:
		log.Error("compare request with the job's snapshot", "err", err)
		return http.StatusInternalServerError, "check job row: " + err.Error(), err
	case !same:
		return http.StatusBadRequest, "request does not match the job's stored request", nil
	}
	return 0, "", nil
}
