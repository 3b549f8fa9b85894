package report

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/spool"
	"github.com/cubesandbox/cubetemplatecenter/test/cubemaster"
	"github.com/cubesandbox/cubetemplatecenter/test/tmpfs"
)

func TestBackoff(t *testing.T) {
	for attempts, want := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second} {
		if got := backoff(attempts, 500*time.Millisecond, 5*time.Second); got != want {
			t.Errorf("backoff(%d) = %s, want %s", attempts, got, want)
		}
	}
	if got := backoff(1000, time.Second, time.Minute); got != time.Minute {
		t.Errorf("backoff(1000) = %s, want the cap", got)
	}
}

func TestRetryable(t *testing.T) {
	for status, want := range map[int]bool{408: true, 429: true, 500: true, 502: true, 503: true, 504: true,
		400: false, 401: false, 403: false, 404: false, 409: false, 413: false} {
		if retryable(status) != want {
			t.Errorf("retryable(%d) = %v", status, !want)
		}
	}
}

// TestDeliveryOrderPerJobUnderFailures drives a real spool and stand-in:
// one job's head report keeps failing while another job's reports flow, and
// once it succeeds the blocked job's reports arrive in order.
func TestDeliveryOrderPerJobUnderFailures(t *testing.T) {
	ctx := context.Background()
	sp, err := spool.Open(ctx, filepath.Join(t.TempDir(), "spool.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	master, err := cubemaster.Start("tok")
	if err != nil {
		t.Fatal(err)
	}
	defer master.Stop()
	var mu sync.Mutex
	failures := 3
	master.Respond(func(jobID string, body map[string]any) int {
		mu.Lock()
		defer mu.Unlock()
		if jobID == "slow" && failures > 0 {
			failures--
			return http.StatusBadGateway
		}
		return 0
	})
	for _, job := range []string{"slow", "fast"} {
		if _, err := sp.Enqueue(ctx, spool.NewJob{ID: job, Request: []byte("{}")}, 10); err != nil {
			t.Fatal(err)
		}
		for i, kind := range []string{spool.KindStatus, spool.KindFingerprint, spool.KindPull} {
			sp.AddReport(ctx, job, spool.Report{Kind: kind, Body: []byte(`{"seq":` + string(rune('0'+i)) + `}`)})
		}
	}
	var outcomes sync.Map
	r := New(sp, func() Settings {
		return Settings{BaseURL: master.URL(), Token: "tok", Timeout: time.Second, RetryInitial: 20 * time.Millisecond,
			RetryMax: 50 * time.Millisecond, ProgressAttempts: 10}
	}, slog.New(slog.NewTextHandler(io.Discard, nil)), func(outcome string, terminal bool) {
		v, _ := outcomes.LoadOrStore(outcome, new(int))
		mu.Lock()
		*v.(*int)++
		mu.Unlock()
	}, nil)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go r.Run(runCtx)
	waitCtx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if _, err := master.WaitFor(waitCtx, func(cbs []cubemaster.Callback) bool { return len(cbs) == 6 }); err != nil {
		t.Fatal(err)
	}
	for _, job := range []string{"slow", "fast"} {
		cbs := master.Callbacks(job)
		for i, c := range cbs {
			if c.Int("seq") != int64(i) || c.Token != "tok" {
				t.Errorf("%s callback %d = %v (token %q), want seq %d", job, i, c.Body, c.Token, i)
			}
		}
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		n, _ := sp.OutboxDepth(ctx)
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("outbox depth = %d after delivery", n)
		}
	}
	v, _ := outcomes.Load(OutcomeRetry)
	if v == nil || *v.(*int) != 3 {
		t.Errorf("retry outcomes = %v, want 3", v)
	}
}

func TestProgressReportsGiveUpTerminalNever(t *testing.T) {
	ctx := context.Background()
	sp, _ := spool.Open(ctx, filepath.Join(t.TempDir(), "spool.db"))
	defer sp.Close()
	master, _ := cubemaster.Start("")
	defer master.Stop()
	master.Respond(func(string, map[string]any) int { return http.StatusServiceUnavailable })
	sp.Enqueue(ctx, spool.NewJob{ID: "j", Request: []byte("{}")}, 10)
	sp.AddReport(ctx, "j", spool.Report{Kind: spool.KindStatus, Body: []byte(`{"status":"RUNNING"}`)})
	sp.Finish(ctx, "j", spool.StateFailed, "PULLING", "x", spool.Report{Kind: spool.KindTerminal, Body: []byte(`{"status":"FAILED"}`)})
	r := New(sp, func() Settings {
		return Settings{BaseURL: master.URL(), Timeout: time.Second, RetryInitial: time.Millisecond, RetryMax: 2 * time.Millisecond, ProgressAttempts: 3}
	}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, nil)
	for i := 0; i < 40; i++ {
		r.DeliverDue(ctx)
		time.Sleep(3 * time.Millisecond)
	}
	reps, _ := sp.Reports(ctx, "j")
	if len(reps) != 1 || !reps[0].Terminal || reps[0].Attempts < 20 {
		t.Fatalf("outbox = %+v, want only the terminal report, still retried", reps)
	}
	if reps[0].LastError == "" {
		t.Error("last error not recorded")
	}
}

// TestRedirectIsNeverFollowed has CubeMaster answer 307 to another host:
// that host must see nothing (no token, no body), and the report stays in
// the outbox as a failed attempt naming the Location.
func TestRedirectIsNeverFollowed(t *testing.T) {
	ctx := context.Background()
	sp, err := spool.Open(ctx, filepath.Join(t.TempDir(), "spool.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	var elsewhere sync.Mutex
	var reached []string
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Lock()
		reached = append(reached, r.Header.Get(api.TokenHeader))
		elsewhere.Unlock()
	}))
	defer other.Close()
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/steal", http.StatusTemporaryRedirect)
	}))
	defer redirector.Close()
	sp.Enqueue(ctx, spool.NewJob{ID: "j", Request: []byte("{}")}, 10)
	sp.Finish(ctx, "j", spool.StateBuilt, "READY", "", spool.Report{Kind: spool.KindTerminal, Body: []byte(`{"status":"BUILT"}`)})
	var retries int
	r := New(sp, func() Settings {
		return Settings{BaseURL: redirector.URL, Token: "secret-token", Timeout: time.Second, RetryInitial: time.Hour, RetryMax: time.Hour, ProgressAttempts: 3}
	}, slog.New(slog.NewTextHandler(io.Discard, nil)), func(outcome string, terminal bool) {
		if outcome == OutcomeRetry {
			retries++
		}
	}, nil)
	if err := r.DeliverDue(ctx); err != nil {
		t.Fatal(err)
	}
	elsewhere.Lock()
	defer elsewhere.Unlock()
	if len(reached) != 0 {
		t.Errorf("the redirect target received %d requests (tokens %q)", len(reached), reached)
	}
	reps, _ := sp.Reports(ctx, "j")
	if len(reps) != 1 || reps[0].Attempts != 1 || retries != 1 {
		t.Fatalf("outbox = %+v, retries = %d; want the terminal report kept after one failed attempt", reps, retries)
	}
	if !strings.Contains(reps[0].LastError, "307") || !strings.Contains(reps[0].LastError, other.URL+"/steal") {
		t.Errorf("last error = %q, want the status and the Location", reps[0].LastError)
	}
}

// TestSlowAnswerHoldsUpNoOtherJob: while CubeMaster takes its time
// answering one job's report, another job's reports are all delivered, in
// order, and the slow job's follow once it answers.
func TestSlowAnswerHoldsUpNoOtherJob(t *testing.T) {
	ctx := context.Background()
	sp, err := spool.Open(ctx, filepath.Join(t.TempDir(), "spool.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	release := make(chan struct{})
	var mu sync.Mutex
	got := map[string][]string{}
	arrived := make(chan struct{}, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		job := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/internal/template/jobs/"), "/status")
		body, _ := io.ReadAll(r.Body)
		if job == "slow" {
			<-release
		}
		mu.Lock()
		got[job] = append(got[job], string(body))
		mu.Unlock()
		arrived <- struct{}{}
	}))
	defer srv.Close()
	defer close(release)
	for _, job := range []string{"slow", "fast"} {
		if _, err := sp.Enqueue(ctx, spool.NewJob{ID: job, Request: []byte("{}")}, 10); err != nil {
			t.Fatal(err)
		}
		for i, kind := range []string{spool.KindStatus, spool.KindFingerprint, spool.KindPull} {
			if err := sp.AddReport(ctx, job, spool.Report{Kind: kind, Body: []byte(`{"seq":` + string(rune('0'+i)) + `}`)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	r := New(sp, func() Settings {
		return Settings{BaseURL: srv.URL, Timeout: time.Minute, RetryInitial: time.Second, RetryMax: time.Second, ProgressAttempts: 3}
	}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, nil)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go r.Run(runCtx)
	deadline := time.After(30 * time.Second)
	for n := 0; n < 3; n++ {
		select {
		case <-arrived:
		case <-deadline:
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("reports of the fast job held up by the slow one's answer: got %v", got)
		}
	}
	mu.Lock()
	fast, slow := got["fast"], len(got["slow"])
	mu.Unlock()
	if want := []string{`{"seq":0}`, `{"seq":1}`, `{"seq":2}`}; strings.Join(fast, " ") != strings.Join(want, " ") || slow != 0 {
		t.Errorf("while the slow job's first answer is pending: fast job got %v (want %v), slow job %d", fast, want, slow)
	}
	release <- struct{}{}
	release <- struct{}{}
	release <- struct{}{}
	for n := 0; n < 3; n++ {
		select {
		case <-arrived:
		case <-deadline:
			t.Fatal("the slow job's reports did not follow its answer")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if s := strings.Join(got["slow"], " "); s != `{"seq":0} {"seq":1} {"seq":2}` {
		t.Errorf("slow job got %s, want its three reports in order", s)
	}
}

// lockedBuffer collects log output written from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// fullSpool opens a spool on a small tmpfs holding job "j" with its
// terminal report, then fills the filesystem. It returns the spool and the
// filler file, whose removal gives the space back.
func fullSpool(t *testing.T) (*spool.Spool, string) {
	t.Helper()
	ctx := context.Background()
	dir := tmpfs.Mount(t, "4m")
	path := filepath.Join(dir, "spool.db")
	sp, err := spool.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Close() })
	if _, err := sp.Enqueue(ctx, spool.NewJob{ID: "j", Request: []byte("{}")}, 10); err != nil {
		t.Fatal(err)
	}
	if err := sp.Finish(ctx, "j", spool.StateBuilt, "READY", "", spool.Report{Kind: spool.KindTerminal, Body: []byte(`{"status":"BUILT"}`)}); err != nil {
		t.Fatal(err)
	}
	// Empty the WAL, so that any later write must grow it on the full disk
	// rather than reuse frames already allocated.
	db, err := sql.Open("sqlite3", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		t.Fatal(err)
	}
	return sp, tmpfs.Fill(t, dir)
}

// TestFullSpoolDiskDoesNotSpin puts the spool on a tmpfs and fills it, so
// that removing a delivered report fails (SQLITE_FULL): the report must
// not be sent again and again, the errors must not flood the log, the
// final delivery at stop must end at once, and once space is back the
// report leaves the outbox without being sent again.
func TestFullSpoolDiskDoesNotSpin(t *testing.T) {
	ctx := context.Background()
	sp, filler := fullSpool(t)
	master, err := cubemaster.Start("")
	if err != nil {
		t.Fatal(err)
	}
	defer master.Stop()

	var logs lockedBuffer
	r := New(sp, func() Settings {
		return Settings{BaseURL: master.URL(), Timeout: time.Second, RetryInitial: 20 * time.Millisecond,
			RetryMax: 200 * time.Millisecond, ProgressAttempts: 3}
	}, slog.New(slog.NewTextHandler(&logs, nil)), nil, nil)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.Run(runCtx) }()
	time.Sleep(2 * time.Second)
	cancel()
	<-done
	posts := len(master.Callbacks("j"))
	if posts < 1 || posts >= 20 {
		t.Errorf("CubeMaster received %d POSTs of the one report in 2s with the spool disk full; want at least 1 and fewer than 20", posts)
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n > 5 {
		t.Errorf("%d ERROR lines in 2s, want at most 5:\n%.2000s", n, logs.String())
	}
	if reps, _ := sp.Reports(ctx, "j"); len(reps) != 1 {
		t.Fatalf("outbox = %+v; want the report still there (its removal fails)", reps)
	}

	// The final delivery at stop must not spin until its deadline.
	stopCtx, stopCancel := context.WithTimeout(ctx, 30*time.Second)
	defer stopCancel()
	start := time.Now()
	r.DeliverDue(stopCtx)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("DeliverDue at stop took %s with the spool disk full; want it to end within a few seconds", took)
	}

	// Space comes back: the report leaves the outbox, not sent again.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel = context.WithCancel(ctx)
	defer cancel()
	go r.Run(runCtx)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if n, _ := sp.OutboxDepth(ctx); n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the delivered report stayed in the outbox after space came back")
		}
	}
	if got := len(master.Callbacks("j")); got != posts {
		t.Errorf("POSTs after space came back = %d, want still %d (the report was delivered already)", got, posts)
	}
}

// TestFullSpoolDiskRetryBacksOff: CubeMaster answers 503 and the spool
// cannot record the failed attempt (disk full), so the outbox still shows
// the report due now; the retries must still follow the backoff, and the
// final delivery at stop must end at once.
func TestFullSpoolDiskRetryBacksOff(t *testing.T) {
	ctx := context.Background()
	sp, _ := fullSpool(t)
	master, err := cubemaster.Start("")
	if err != nil {
		t.Fatal(err)
	}
	defer master.Stop()
	master.Respond(func(string, map[string]any) int { return http.StatusServiceUnavailable })
	r := New(sp, func() Settings {
		return Settings{BaseURL: master.URL(), Timeout: time.Second, RetryInitial: 100 * time.Millisecond,
			RetryMax: time.Second, ProgressAttempts: 3}
	}, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, nil)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); r.Run(runCtx) }()
	time.Sleep(2 * time.Second)
	cancel()
	<-done
	if posts := len(master.All()); posts < 2 || posts >= 20 {
		t.Errorf("CubeMaster received %d POSTs in 2s with 100ms..1s backoff and the spool disk full; want a few, fewer than 20", posts)
	}
	stopCtx, stopCancel := context.WithTimeout(ctx, 30*time.Second)
	defer stopCancel()
	start := time.Now()
	r.DeliverDue(stopCtx)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("DeliverDue at stop took %s with the spool disk full; want it to end within a few seconds", took)
	}
}
