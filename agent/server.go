package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/artifacts"
	"github.com/cubesandbox/cubetemplatecenter/agent/httpobs"
	"github.com/cubesandbox/cubetemplatecenter/agent/masterdb"
	"github.com/cubesandbox/cubetemplatecenter/agent/space"
	"github.com/cubesandbox/cubetemplatecenter/agent/tracing"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// Handler is the agent's HTTP API.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /tc/api/v1/build", a.authorized(a.handleBuild))
	mux.Handle("POST /tc/api/v1/artifact/delete", a.authorized(a.handleArtifactDelete))
	mux.Handle("POST /tc/api/v1/artifact/upload", a.authorized(a.handleArtifactUpload))
	mux.Handle("GET /tc/api/v1/jobs", a.authorized(a.handleJobs))
	mux.Handle("GET /tc/api/v1/jobs/{id}", a.authorized(a.handleJob))
	mux.Handle("POST /tc/api/v1/jobs/{id}/cancel", a.authorized(a.handleJobCancel))
	mux.HandleFunc("GET /health", a.handleHealth)
	mux.HandleFunc("GET /livez", a.handleLivez)
	mux.HandleFunc("GET /readyz", a.handleReadyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.metrics.registry, promhttp.HandlerOpts{}))
	mux.Handle(apiPrefix, apiNotFound(mux))
	return a.http.Wrap(mux)
}

// probeRoutes are the probes' routes: their 503 is an answer, with the
// reasons in the body, not a rejected request.
var probeRoutes = []string{"GET /health", "GET /livez", "GET /readyz"}

// apiPrefix is where every answer is JSON, errors included.
const apiPrefix = "/tc/api/v1/"

// apiMethods are the methods a path under apiPrefix is tried with to tell
// a 405 (another method has a route) from a 404.
var apiMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// apiNotFound answers what no API route takes, as JSON: 405 with Allow
// when the path has routes for other methods, 404 otherwise. ServeMux's
// own answers are plain text, and the route label stays "unmatched".
func apiNotFound(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var allow []string
		for _, m := range apiMethods {
			probe := &http.Request{Method: m, URL: r.URL, Host: r.Host, Header: http.Header{}}
			if _, pattern := mux.Handler(probe); pattern != apiPrefix && pattern != "" {
				allow = append(allow, m)
			}
		}
		r.Pattern = ""
		if len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s is not allowed on %s (allowed: %s)",
				safetext.Name(r.Method), safetext.Name(r.URL.Path), strings.Join(allow, ", ")))
			return
		}
		writeError(w, http.StatusNotFound, "no API route "+safetext.Name(r.URL.Path))
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	httpobs.NoteReason(w, msg)
	writeJSON(w, status, map[string]string{"error": msg})
}

// refusal is a spool commit refused for want of writable storage.
type refusal struct {
	at  time.Time
	err error
}

// refusalShown is how long /health reports a refused commit when no submit
// has committed since.
const refusalShown = time.Minute

// recentRefusal returns the spool's last refused submit commit when it is
// younger than refusalShown and no commit succeeded since, nil otherwise.
func (a *Agent) recentRefusal() error {
	f := a.spoolRefused.Load()
	if f == nil || time.Since(f.at) >= refusalShown {
		return nil
	}
	return fmt.Errorf("the spool refused a commit %s ago: %w", time.Since(f.at).Round(time.Second), f.err)
}

// retryAfter is the Retry-After, in seconds, of answers that a condition
// on this node (a volume short of space, uploads at their bound) refuses.
const retryAfter = "30"

// writeRetryLater answers status with a Retry-After, for a condition on
// this node that may pass (503, which CubeMaster retries where a 500 would
// fail the job for good; 429; 507).
func writeRetryLater(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Retry-After", retryAfter)
	writeError(w, status, msg)
}

// authorized applies the shared-token rule to h's requests.
func (a *Agent) authorized(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.admit(w, r) {
			h(w, r)
		}
	})
}

// admit applies the shared-token rule to r, reading the policy per
// request; a refusal is answered here.
func (a *Agent) admit(w http.ResponseWriter, r *http.Request) bool {
	m := a.config().Master
	if status, msg := (api.TokenPolicy{Token: m.Token, Insecure: m.InsecureNoToken}).Check(r); status != 0 {
		writeError(w, status, msg)
		return false
	}
	return true
}

// readBody reads a request body up to the configured limit, answering 413
// or 400 itself when it cannot.
func (a *Agent) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	limit := int64(a.config().Common.MaxBodyBytes)
	body, err := io.ReadAll(http.MaxBytesReader(httpobs.ServerWriter(w), r.Body, limit))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body exceeds %d bytes", limit))
		return nil, false
	case err != nil:
		writeError(w, http.StatusBadRequest, "read request body: "+err.Error())
		return nil, false
	}
	return body, true
}

// handleBuild accepts a build: the 200 goes out only once the job is
// committed to the spool.
func (a *Agent) handleBuild(w http.ResponseWriter, r *http.Request) {
	if a.stopping.Load() {
		writeError(w, http.StatusServiceUnavailable, "template center is shutting down")
		return
	}
	body, ok := a.readBody(w, r)
	if !ok {
		return
	}
	b, err := api.ParseBuild(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if _, err := rootfs.ValidateImageRef(b.Template.SourceImageRef); err != nil {
		writeError(w, http.StatusBadRequest, "request.source_image_ref: "+err.Error())
		return
	}
	httpobs.NoteAttrs(w, "job_id", b.JobID)
	if status, msg, cause := a.checkJobRow(r.Context(), b); status != 0 {
		if cause != nil {
			httpobs.NoteAttrs(w, "err", cause)
		}
		writeError(w, status, msg)
		return
	}
	log := a.logger.With("job_id", b.JobID)
	// Refuse before trying rather than fail the commit: a 503 is retried
	// by CubeMaster, a 500 is final.
	if err := space.Named(a.config(), space.Spool).RoomFor(0); err != nil {
		writeRetryLater(w, http.StatusServiceUnavailable, "cannot accept jobs: "+err.Error())
		return
	}
	// The commit must not depend on the caller staying connected: a job
	// committed but unacknowledged is re-sent by CubeMaster and gets a 409.
	ctx := context.WithoutCancel(r.Context())
	// With credentials in the request the spool scrubs its WAL when the
	// job ends; without, it spares the job that checkpoint.
	secret := b.Template.RegistryUsername != "" || b.Template.RegistryPassword != ""
	span, tc := a.startSubmit(r, b)
	job, err := a.spool.Enqueue(ctx, spool.NewJob{ID: b.JobID, Request: body, Secret: secret,
		TraceParent: tc.Traceparent, TraceState: tc.Tracestate}, a.config().Build.QueueSize)
	defer func() { endSubmit(span, err) }()
	switch {
	case errors.Is(err, spool.ErrJobExists) && job.State.Terminal():
		if err := a.spool.Resend(ctx, b.JobID); err != nil {
			log.Error("resend terminal report", "err", err)
			if errors.Is(err, spool.ErrCannotWrite) {
				writeRetryLater(w, http.StatusServiceUnavailable, "resend result of finished job: "+err.Error())
				return
			}
			writeError(w, http.StatusInternalServerError, "resend result of finished job: "+err.Error())
			return
		}
		a.reporter.Wake()
		log.Info("job already finished, result re-sent", "state", job.State)
		writeJSON(w, http.StatusOK, map[string]string{"status": "accepted", "job_id": b.JobID})
	case errors.Is(err, spool.ErrJobExists):
		writeError(w, http.StatusConflict, "build job already in flight")
	case errors.Is(err, spool.ErrQueueFull):
		httpobs.NoteAttrs(w, "queue_size", a.config().Build.QueueSize)
		writeError(w, http.StatusTooManyRequests, "build queue is full")
	case errors.Is(err, spool.ErrCannotWrite):
		log.Error("commit job: spool storage refuses writes", "err", err)
		a.spoolRefused.Store(&refusal{at: time.Now(), err: err})
		writeRetryLater(w, http.StatusServiceUnavailable, "commit job: the spool's volume cannot take writes (full, failing or read-only): "+err.Error())
	case err != nil:
		log.Error("commit job", "err", err)
		writeError(w, http.StatusInternalServerError, "commit job: "+err.Error())
	default:
		a.spoolRefused.Store(nil)
		a.metrics.accepted.Inc()
		a.exec.Wake()
		log.Info("job accepted", "image", b.Template.SourceImageRef, "template_id", b.Template.TemplateID,
			"request_id", b.Template.RequestID)
		writeJSON(w, http.StatusOK, map[string]string{"status": "accepted", "job_id": b.JobID})
	}
}

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

// startSubmit starts the span of accepting a build, child of the trace
// context CubeMaster sent (a new root without one). Its context is stored
// with the job: every run of the job and every report continues it.
func (a *Agent) startSubmit(r *http.Request, b *api.Build) (trace.Span, tracing.Stored) {
	ctx := tracing.FromHeader(context.WithoutCancel(r.Context()), r.Header)
	ctx, span := a.tracer.Start(ctx, tracing.SpanSubmit, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String(tracing.AttrJobID, b.JobID), attribute.String(tracing.AttrRequestID, b.Template.RequestID),
		attribute.String(tracing.AttrTemplateID, b.Template.TemplateID), attribute.String(tracing.AttrImage, b.Template.SourceImageRef)))
	return span, tracing.Store(ctx)
}

// endSubmit ends the submit span; a job already known is no error.
func endSubmit(span trace.Span, err error) {
	if errors.Is(err, spool.ErrJobExists) {
		err = nil
	}
	tracing.End(span, err)
}

// handleArtifactDelete deletes an artifact's data, idempotently.
func (a *Agent) handleArtifactDelete(w http.ResponseWriter, r *http.Request) {
	body, ok := a.readBody(w, r)
	if !ok {
		return
	}
	var req struct {
		ArtifactID string `json:"artifact_id"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "malformed JSON body: "+err.Error())
		return
	}
	id := strings.TrimSpace(req.ArtifactID)
	switch {
	case id == "":
		writeError(w, http.StatusBadRequest, "artifact_id: required")
		return
	case !api.ValidArtifactID(id):
		writeError(w, http.StatusBadRequest, "artifact_id: not a plain artifact id")
		return
	}
	switch err := a.artifacts.Delete(r.Context(), id); {
	case errors.Is(err, artifacts.ErrDatabaseUnavailable):
		writeError(w, http.StatusServiceUnavailable, "CubeMaster's database is unavailable; retry later")
		return
	case artifacts.Refused(err):
		writeError(w, http.StatusConflict, err.Error())
		return
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "deleted", "artifact_id": id})
}

// jobView is a job as the API shows it: never the request, which holds
// credentials.
type jobView struct {
	JobID       string          `json:"job_id"`
	State       spool.State     `json:"state"`
	Phase       string          `json:"phase,omitempty"`
	Progress    int             `json:"progress"`
	Attempts    int             `json:"attempts"`
	Fingerprint string          `json:"template_spec_fingerprint,omitempty"`
	ArtifactID  string          `json:"artifact_id,omitempty"`
	Error       string          `json:"error_message,omitempty"`
	Result      json.RawMessage `json:"result,omitempty"`
	CreatedAt   time.Time       `json:"created_at"`
	UpdatedAt   time.Time       `json:"updated_at"`
	StartedAt   *time.Time      `json:"started_at,omitempty"`
	FinishedAt  *time.Time      `json:"finished_at,omitempty"`
	// Traceparent finds the job's trace in a trace collector.
	Traceparent string `json:"traceparent,omitempty"`
}

// View renders a job for people and programs, without its request.
func View(j spool.Job) any {
	v := jobView{JobID: j.ID, State: j.State, Phase: j.Phase, Progress: j.Progress, Attempts: j.Attempts,
		Fingerprint: j.Fingerprint, ArtifactID: j.ArtifactID, Error: j.Error, Result: j.Result,
		CreatedAt: j.CreatedAt, UpdatedAt: j.UpdatedAt, Traceparent: j.TraceParent}
	if !j.StartedAt.IsZero() {
		v.StartedAt = &j.StartedAt
	}
	if !j.FinishedAt.IsZero() {
		v.FinishedAt = &j.FinishedAt
	}
	return v
}

func (a *Agent) handleJob(w http.ResponseWriter, r *http.Request) {
	j, err := a.spool.Job(r.Context(), r.PathValue("id"))
	switch {
	case errors.Is(err, spool.ErrNotFound):
		writeError(w, http.StatusNotFound, "job not found")
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
	default:
		writeJSON(w, http.StatusOK, View(j))
	}
}

// handleJobCancel ends a queued or running job FAILED "cancelled". The 200
// goes out only once that is committed to the spool: the job is never
// resumed, even if the agent stops before the build notices.
func (a *Agent) handleJobCancel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	// The commit must not depend on the caller staying connected.
	j, err := a.exec.Cancel(context.WithoutCancel(r.Context()), id)
	switch {
	case errors.Is(err, spool.ErrNotFound):
		writeError(w, http.StatusNotFound, "job not found")
	case errors.Is(err, spool.ErrFinished):
		httpobs.NoteReason(w, "job already finished: "+string(j.State))
		writeJSON(w, http.StatusConflict, map[string]string{"error": "job already finished: " + string(j.State),
			"job_id": id, "state": string(j.State)})
	case err != nil:
		a.logger.Error("cancel job", "job_id", id, "err", err)
		writeError(w, http.StatusInternalServerError, err.Error())
	default:
		writeJSON(w, http.StatusOK, map[string]string{"status": "cancelled", "job_id": id})
	}
}

func (a *Agent) handleJobs(w http.ResponseWriter, r *http.Request) {
	f := spool.JobFilter{State: spool.State(r.URL.Query().Get("state")), Limit: 100}
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 10000 {
			writeError(w, http.StatusBadRequest, "limit: want 1..10000")
			return
		}
		f.Limit = n
	}
	jobs, err := a.spool.Jobs(r.Context(), f)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	views := make([]any, 0, len(jobs))
	for _, j := range jobs {
		views = append(views, View(j))
	}
	writeJSON(w, http.StatusOK, map[string]any{"jobs": views})
}
