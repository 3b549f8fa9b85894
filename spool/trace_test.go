package spool

import (
	"context"
	"path/filepath"
	"testing"
)

const (
	testParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	testState  = "vendor=abc"
)

// TestTraceContextStored: a job keeps the trace context it was queued
// with across claim and requeue, and its reports take it unless they carry
// their own.
func TestTraceContextStored(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	if _, err := s.Enqueue(ctx, NewJob{ID: "j", Request: []byte(`{}`), TraceParent: testParent, TraceState: testState}, 10); err != nil {
		t.Fatal(err)
	}
	j, ok, err := s.ClaimNext(ctx)
	if err != nil || !ok {
		t.Fatalf("ClaimNext = %v, %v", ok, err)
	}
	if j.TraceParent != testParent || j.TraceState != testState {
		t.Errorf("claimed job trace = %q %q, want %q %q", j.TraceParent, j.TraceState, testParent, testState)
	}
	if _, err := s.RequeueRunning(ctx); err != nil {
		t.Fatal(err)
	}
	if j, _, _ = s.ClaimNext(ctx); j.TraceParent != testParent {
		t.Errorf("job claimed again after requeue has traceparent %q, want %q", j.TraceParent, testParent)
	}
	if err := s.AddReport(ctx, "j", Report{Kind: KindStatus, Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	const own = "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01"
	if err := s.Finish(ctx, "j", StateBuilt, "READY", "", Report{Kind: KindTerminal, Body: []byte(`{}`), TraceParent: own}); err != nil {
		t.Fatal(err)
	}
	reps, err := s.DueReports(ctx, s.now().Add(1), 10)
	if err != nil || len(reps) != 1 {
		t.Fatalf("DueReports = %d reports, %v; want the status report", len(reps), err)
	}
	if reps[0].TraceParent != testParent || reps[0].TraceState != testState {
		t.Errorf("status report trace = %q %q, want the job's", reps[0].TraceParent, reps[0].TraceState)
	}
	if err := s.RemoveReport(ctx, reps[0].ID); err != nil {
		t.Fatal(err)
	}
	term, ok, err := s.DueReportOf(ctx, "j", s.now().Add(1))
	if err != nil || !ok {
		t.Fatalf("DueReportOf = %v, %v", ok, err)
	}
	if term.TraceParent != own || term.TraceState != "" {
		t.Errorf("terminal report trace = %q %q, want its own %q and no state", term.TraceParent, term.TraceState, own)
	}
}

// TestTraceColumnsMigrated: jobs and reports of a release before trace
// context read back with none, and a report added to such a job after the
// upgrade gets none either.
func TestTraceColumnsMigrated(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "spool.db")
	old, err := open(ctx, path, false, busyTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.migrate(ctx, 4); err != nil {
		t.Fatalf("migrate to v4: %v", err)
	}
	if _, err := old.db.Exec(`INSERT INTO jobs (job_id, state, request, created_at, updated_at) VALUES ('j1', 'running', '{}', 1, 1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := old.db.Exec(`INSERT INTO reports (job_id, kind, terminal, body, next_attempt, created_at)
		VALUES ('j1', 'status', 0, '{}', 1, 1)`); err != nil {
		t.Fatal(err)
	}
	old.Close()
	s := openAt(t, path)
	j, err := s.Job(ctx, "j1")
	if err != nil {
		t.Fatalf("Job after migration: %v", err)
	}
	if j.TraceParent != "" || j.TraceState != "" {
		t.Errorf("migrated job trace = %q %q, want none", j.TraceParent, j.TraceState)
	}
	if err := s.AddReport(ctx, "j1", Report{Kind: KindPull, Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	reps, err := s.DueReports(ctx, s.now().Add(1), 10)
	if err != nil || len(reps) != 1 {
		t.Fatalf("DueReports = %d, %v; want 1", len(reps), err)
	}
	if reps[0].TraceParent != "" {
		t.Errorf("migrated report traceparent = %q, want none", reps[0].TraceParent)
	}
}
