package httpobs

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// reject answers status with reason noted, as the daemon's handlers do.
func reject(w http.ResponseWriter, status int, reason string) {
	NoteReason(w, reason)
	w.WriteHeader(status)
}

// TestRejectionLogRateLimited: past the burst, rejections of one route and
// status are counted, not logged, and the next line logged after the window
// says how many were left out; another status has its own allowance.
func TestRejectionLogRateLimited(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1_700_000_000, 0)
	o := New(slog.New(slog.NewTextHandler(&buf, nil)))
	o.limit = newRejectLimiter(2, time.Minute, func() time.Time { return now })
	mux := http.NewServeMux()
	mux.HandleFunc("POST /x", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("full") != "" {
			reject(w, http.StatusServiceUnavailable, "volume full")
			return
		}
		reject(w, http.StatusUnauthorized, "bad token")
	})
	h := o.Wrap(mux)
	send := func(q string) {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/x"+q, nil))
	}
	lines := func() []string { return strings.Split(strings.TrimSpace(buf.String()), "\n") }

	for range 5 {
		send("")
	}
	send("?full=1")
	if got := lines(); len(got) != 3 {
		t.Fatalf("after 5 rejections of one kind and 1 of another: %d lines, want 3:\n%s", len(got), buf.String())
	}
	now = now.Add(time.Minute)
	send("")
	got := lines()
	if len(got) != 4 || !strings.Contains(got[3], "suppressed=3") || !strings.Contains(got[3], `reason="bad token"`) {
		t.Fatalf("first line after the window: %q, want one with suppressed=3", got[len(got)-1])
	}
	send("")
	if got := lines(); strings.Contains(got[len(got)-1], "suppressed") {
		t.Errorf("the count is given once: %q", got[len(got)-1])
	}
}

// TestWrapCountsAndLogs: requests count under their pattern, or under one
// label value when none matched; a rejection is logged once with what its
// handler noted, at INFO for routine refusals; a probe's 503 and a
// handler's silence (200) are no rejection.
func TestWrapCountsAndLogs(t *testing.T) {
	var buf bytes.Buffer
	o := New(slog.New(slog.NewTextHandler(&buf, nil)), "GET /probe")
	mux := http.NewServeMux()
	mux.HandleFunc("POST /jobs/{id}", func(w http.ResponseWriter, r *http.Request) {
		NoteAttrs(w, "job_id", r.PathValue("id"))
		reject(w, http.StatusConflict, "already in flight")
	})
	mux.HandleFunc("GET /probe", func(w http.ResponseWriter, r *http.Request) { reject(w, http.StatusServiceUnavailable, "not ready") })
	mux.HandleFunc("GET /quiet", func(http.ResponseWriter, *http.Request) {})
	h := o.Wrap(mux)
	for _, req := range []*http.Request{
		httptest.NewRequest(http.MethodPost, "/jobs/j1", nil),
		httptest.NewRequest(http.MethodGet, "/probe", nil),
		httptest.NewRequest(http.MethodGet, "/quiet", nil),
		httptest.NewRequest("BREW", "/random/a", nil),
		httptest.NewRequest(http.MethodGet, "/random/b", nil),
	} {
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(o.Collectors()...)
	want := `
# HELP http_requests_total HTTP requests answered, by route (the API pattern, or unmatched), method and status code.
# TYPE http_requests_total counter
http_requests_total{code="200",method="GET",route="GET /quiet"} 1
http_requests_total{code="404",method="GET",route="unmatched"} 1
http_requests_total{code="404",method="other",route="unmatched"} 1
http_requests_total{code="409",method="POST",route="POST /jobs/{id}"} 1
http_requests_total{code="503",method="GET",route="GET /probe"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "http_requests_total"); err != nil {
		t.Error(err)
	}
	logs := buf.String()
	if n := strings.Count(logs, "request rejected"); n != 3 {
		t.Errorf("%d rejection lines, want 3 (409 and two 404s):\n%s", n, logs)
	}
	for _, want := range []string{
		`level=INFO msg="request rejected" component=http route="POST /jobs/{id}" method=POST path=/jobs/j1 status=409 reason="already in flight" remote=192.0.2.1:1234 job_id=j1`,
		`route=unmatched method=other path=/random/a status=404 reason="Not Found"`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "/probe") || strings.Contains(logs, "/quiet") {
		t.Errorf("a probe's answer or a 200 was logged as a rejection:\n%s", logs)
	}
}

// TestServerWriter: behind the observer a handler still reaches the
// server's own writer, which http.MaxBytesReader needs to close the
// connection.
func TestServerWriter(t *testing.T) {
	inner := httptest.NewRecorder()
	var got http.ResponseWriter
	New(slog.New(slog.DiscardHandler)).Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		got = ServerWriter(w)
	})).ServeHTTP(inner, httptest.NewRequest(http.MethodGet, "/", nil))
	if got != http.ResponseWriter(inner) {
		t.Errorf("ServerWriter = %T, want the server's writer", got)
	}
	if w := ServerWriter(inner); w != http.ResponseWriter(inner) {
		t.Errorf("ServerWriter of an unwrapped writer = %T, want it unchanged", w)
	}
}

func TestBoundedMethod(t *testing.T) {
	for in, want := range map[string]string{"GET": "GET", "POST": "POST", "BREW": "other", "get": "other"} {
		if got := boundedMethod(in); got != want {
			t.Errorf("boundedMethod(%q) = %q, want %q", in, got, want)
		}
	}
}
