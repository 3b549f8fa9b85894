package masterdb

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Job statuses of t_cube_template_image_job.status that TC acts on.
const (
	JobPending = "PENDING"
	JobRunning = "RUNNING"
)

// JobRow is what the submit check reads of a t_cube_template_image_job row.
type JobRow struct {
	JobID string
	// Status is PENDING, RUNNING, BUILT, READY or FAILED, as stored.
	Status string
	// RequestJSON is the request snapshot CubeMaster stored at create
	// (registry_password blanked); empty when it stored none.
	RequestJSON string
}

// Buildable reports whether TC may accept a build of the job: PENDING, or
// RUNNING so that a re-delivery is accepted too. Case matters, as stored.
func (j JobRow) Buildable() bool { return j.Status == JobPending || j.Status == JobRunning }

// JobForSubmit reads the job row of jobID; ErrJobNotFound when there is
// none, only a soft-deleted one, or only one whose id differs in case.
func (d *DB) JobForSubmit(ctx context.Context, jobID string) (JobRow, error) {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	q := "SELECT job_id, status, request_json FROM t_cube_template_image_job WHERE job_id = ? AND deleted_at IS NULL"
	var row JobRow
	var req sql.NullString
	err := d.db.QueryRowContext(ctx, d.bind(q), jobID).Scan(&row.JobID, &row.Status, &req)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return JobRow{}, fmt.Errorf("job %s: %w", jobID, ErrJobNotFound)
	case err != nil:
		return JobRow{}, d.wrap("read job "+jobID+" from", err)
	}
	if row.JobID != jobID {
		// MySQL's default collation compares without case (and pads
		// spaces): a job id must name its row exactly, as on PostgreSQL.
		return JobRow{}, fmt.Errorf("job %s: %w", jobID, ErrJobNotFound)
	}
	row.RequestJSON = req.String
	return row, nil
}

// snapshotOmits are the request fields CubeMaster's stored snapshot does
// not bind: the registry password (blanked when stored) and the request
// id of the transport envelope. Matched without case, as CubeMaster's
// decoding matches names.
var snapshotOmits = []string{"registry_password", "requestid"}

// CanonicalRequest renders a CreateTemplateFromImageReq object for the
// snapshot comparison: registry_password and requestID removed, object
// members whose value is null removed (null and absent decode alike), keys
// sorted, numbers and every other value kept as written.
func CanonicalRequest(raw []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("decode request: %w", err)
	}
	if dec.More() {
		return nil, errors.New("decode request: data after the JSON object")
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("decode request: not a JSON object")
	}
	for k := range obj {
		for _, omit := range snapshotOmits {
			if strings.EqualFold(k, omit) {
				delete(obj, k)
			}
		}
	}
	out, err := json.Marshal(dropNulls(obj))
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	return out, nil
}

// dropNulls removes null object members at every depth.
func dropNulls(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			if e == nil {
				delete(t, k)
				continue
			}
			t[k] = dropNulls(e)
		}
	case []any:
		for i, e := range t {
			t[i] = dropNulls(e)
		}
	}
	return v
}

// MatchesRequest reports whether submitted (the build's request object)
// is the request the job's snapshot holds, once both are canonical; an
// empty snapshot matches anything. A snapshot that is not a JSON object is
// an error: the job cannot be checked.
func (j JobRow) MatchesRequest(submitted []byte) (bool, error) {
	if strings.TrimSpace(j.RequestJSON) == "" {
		return true, nil
	}
	stored, err := CanonicalRequest([]byte(j.RequestJSON))
	if err != nil {
		return false, fmt.Errorf("job %s request_json: %w", j.JobID, err)
	}
	got, err := CanonicalRequest(submitted)
	if err != nil {
		return false, fmt.Errorf("submitted request: %w", err)
	}
	return bytes.Equal(stored, got), nil
}
