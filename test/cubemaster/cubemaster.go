// Package cubemaster is a stand-in for CubeMaster's side of the contract:
// it receives status callbacks on /internal/template/jobs/{job_id}/status,
// applies CubeMaster's token rule and terminal-state guard, records every
// report in order, and can be told to fail or vanish. It also writes the
// build requests CubeMaster sends (BuildRequest). Tests, the demo and the
// benchmarks drive the agent against it.
//
// With UseDatabase it also keeps CubeMaster's database, so that TC replicas
// sharing it can be tested: CreateJob inserts the job row CubeMaster writes
// before it posts a build; callbacks update that row (the columns CubeMaster
// copies, with its terminal-state guard); a BUILT callback registers the
// artifact row under the build lock (BuildLockName) before it is answered,
// adopting an existing READY row of the fingerprint, and answers 500 when it
// cannot, so TC retries; DeleteArtifact marks a row CLEANUP_PENDING and asks
// TC to delete it. ArtifactRows, JobRow and AgeArtifact serve assertions.
package cubemaster

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// tokenHeader carries the shared secret in both directions.
const tokenHeader = "X-Cube-Template-Callback-Token"

// Callback is one status report as received.
type Callback struct {
	JobID string
	Body  map[string]any
	Token string
	// Traceparent is the W3C trace context header the callback carried.
	Traceparent string
	Status      int // what the stand-in answered
	At          time.Time
}

// Field returns a string field of the report ("" when absent).
func (c Callback) Field(key string) string {
	v, _ := c.Body[key].(string)
	return v
}

// Int returns a numeric field of the report.
func (c Callback) Int(key string) int64 {
	f, _ := c.Body[key].(float64)
	return int64(f)
}

// Terminal reports whether the callback ends the job.
func (c Callback) Terminal() bool {
	s := c.Field("status")
	return s == "BUILT" || s == "FAILED"
}

// Server is a running stand-in.
type Server struct {
	// Token is the shared secret expected; empty accepts any request.
	Token string
	// LockWait bounds the wait for the build lock when a BUILT callback
	// registers its artifact in database mode; 0 is DefaultLockWait.
	LockWait time.Duration

	mu        sync.Mutex
	callbacks []Callback
	terminal  map[string]string
	respond   func(jobID string, body map[string]any) int
	db        *store
	changed   chan struct{}
	srv       *http.Server
	ln        net.Listener
	addr      string
}

// Start serves the stand-in on a free loopback port.
func Start(token string) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	s := &Server{Token: token, terminal: map[string]string{}, changed: make(chan struct{})}
	s.serve(ln)
	return s, nil
}

func (s *Server) serve(ln net.Listener) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /internal/template/jobs/{job_id}/status", s.handle)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	s.ln = ln
	s.addr = ln.Addr().String()
	go s.srv.Serve(ln)
}

// URL is the base URL to give the agent as CUBE_MASTER_ADDR.
func (s *Server) URL() string { return "http://" + s.addr }

// Respond installs a function choosing the HTTP status for each callback
// (0 or nil means CubeMaster's normal behaviour).
func (s *Server) Respond(f func(jobID string, body map[string]any) int) {
	s.mu.Lock()
	s.respond = f
	s.mu.Unlock()
}

// Hold makes the stand-in answer every report 503, as an overloaded
// CubeMaster would, so reports stay in the agent's outbox; Release restores
// normal answers. Both replace what Respond installed.
func (s *Server) Hold() {
	s.Respond(func(string, map[string]any) int { return http.StatusServiceUnavailable })
}

// Release undoes Hold: reports get CubeMaster's normal answers again.
func (s *Server) Release() { s.Respond(nil) }

// Stop makes the stand-in vanish: connections are refused.
func (s *Server) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s.srv.Shutdown(ctx)
}

// Restart brings a stopped stand-in back on the same address.
func (s *Server) Restart() error {
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ {
		if ln, err = net.Listen("tcp", s.addr); err == nil {
			s.serve(ln)
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("relisten on %s: %w", s.addr, err)
}

func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
	jobID := r.PathValue("job_id")
	token := strings.TrimSpace(r.Header.Get(tokenHeader))
	var body map[string]any
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	err := dec.Decode(&body)

	s.mu.Lock()
	status := http.StatusOK
	msg := ""
	switch {
	case s.Token != "" && subtle.ConstantTimeCompare([]byte(token), []byte(s.Token)) != 1:
		status, msg = http.StatusUnauthorized, "invalid or missing callback token"
	case err != nil:
		status, msg = http.StatusBadRequest, "invalid JSON"
	case len(body) == 0:
		status, msg = http.StatusBadRequest, "no updatable fields in payload"
	}
	if status == http.StatusOK && s.respond != nil {
		if st := s.respond(jobID, body); st != 0 {
			status, msg = st, fmt.Sprintf("stand-in answered %d", st)
		}
	}
	if status == http.StatusOK && s.db != nil {
		// The database work (a BUILT waits for its build lock) runs
		// unlocked, so that callbacks of other jobs go on meanwhile;
		// the guard is checked before it and again after.
		if status, msg = s.guardTerminal(jobID, body, false); status == http.StatusOK {
			db, wait := s.db, s.LockWait
			if wait <= 0 {
				wait = DefaultLockWait
			}
			s.mu.Unlock()
			status, msg = db.apply(r.Context(), jobID, body, wait)
			s.mu.Lock()
		}
	}
	if status == http.StatusOK {
		status, msg = s.guardTerminal(jobID, body, true)
	}
	s.callbacks = append(s.callbacks, Callback{JobID: jobID, Body: body, Token: token,
		Traceparent: r.Header.Get("traceparent"), Status: status, At: time.Now()})
	close(s.changed)
	s.changed = make(chan struct{})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if msg != "" {
		json.NewEncoder(w).Encode(map[string]string{"error": msg})
	} else {
		json.NewEncoder(w).Encode(map[string]string{"status": "ok"})
	}
	s.mu.Unlock()
}

// guardTerminal applies the terminal-state guard to an accepted callback
// (s.mu held): a job that ended BUILT or FAILED may not end otherwise.
// With record, a terminal callback that passes is remembered.
func (s *Server) guardTerminal(jobID string, body map[string]any, record bool) (int, string) {
	st, _ := body["status"].(string)
	if st != "BUILT" && st != "FAILED" {
		return http.StatusOK, ""
	}
	if prev, ok := s.terminal[jobID]; ok && prev != st {
		return http.StatusConflict, "job already in terminal state " + prev
	}
	if record {
		s.terminal[jobID] = st
	}
	return http.StatusOK, ""
}

// Callbacks returns the callbacks for jobID (all jobs when empty) that the
// stand-in accepted with 200, in arrival order.
func (s *Server) Callbacks(jobID string) []Callback {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Callback
	for _, c := range s.callbacks {
		if (jobID == "" || c.JobID == jobID) && c.Status == http.StatusOK {
			out = append(out, c)
		}
	}
	return out
}

// All returns every callback received, whatever the answer.
func (s *Server) All() []Callback {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Callback(nil), s.callbacks...)
}

// WaitFor blocks until cond holds over the accepted callbacks or ctx ends.
func (s *Server) WaitFor(ctx context.Context, cond func([]Callback) bool) ([]Callback, error) {
	for {
		s.mu.Lock()
		ch := s.changed
		s.mu.Unlock()
		cbs := s.Callbacks("")
		if cond(cbs) {
			return cbs, nil
		}
		select {
		case <-ctx.Done():
			return cbs, fmt.Errorf("wait for callbacks: %w (got %d)", ctx.Err(), len(cbs))
		case <-ch:
		}
	}
}

// WaitTerminal waits for the accepted terminal report of jobID.
func (s *Server) WaitTerminal(ctx context.Context, jobID string) (Callback, error) {
	var found Callback
	_, err := s.WaitFor(ctx, func(cbs []Callback) bool {
		for _, c := range cbs {
			if c.JobID == jobID && c.Terminal() {
				found = c
				return true
			}
		}
		return false
	})
	return found, err
}
