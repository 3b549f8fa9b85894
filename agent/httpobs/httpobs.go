// Package httpobs observes an HTTP API at one place: it counts every
// request by route, method and status, times it, and logs each rejected
// request once, rate-limited, with the reason its handler noted. Handlers
// only answer; they never log a refusal themselves.
package httpobs

import (
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Unmatched is the route label of requests no pattern matched (404,
// 405): one value whatever the path, so that a scan of random URLs cannot
// grow the series without bound.
const Unmatched = "unmatched"

// Rejection logging: at most rejectBurst lines per (route, status) in each
// rejectWindow; the next line logged for that pair carries the count of
// lines left out.
const (
	rejectBurst  = 5
	rejectWindow = time.Minute
)

// Observer counts every request and logs each rejected one once.
type Observer struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	logger   *slog.Logger
	limit    *rejectLimiter
	// probes are the routes whose refusals are answers (a probe's 503
	// carries its reasons in the body), never logged as rejections.
	probes []string
}

// New returns an Observer logging through logger; the answers of the
// probes routes are never logged as rejections. Its series are named
// without a namespace: register Collectors with a prefixing Registerer.
func New(logger *slog.Logger, probes ...string) *Observer {
	return &Observer{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "http", Name: "requests_total",
			Help: "HTTP requests answered, by route (the API pattern, or unmatched), method and status code.",
		}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: "http", Name: "request_duration_seconds",
			Help:    "Time from a request's headers to the end of its handler, by route.",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"route"}),
		logger: logger.With("component", "http"),
		limit:  newRejectLimiter(rejectBurst, rejectWindow, time.Now),
		probes: probes,
	}
}

// Collectors are the observer's series.
func (o *Observer) Collectors() []prometheus.Collector {
	return []prometheus.Collector{o.requests, o.duration}
}

// Wrap observes the requests mux serves. It reads the matched pattern from
// the request after mux has served it (ServeMux sets Request.Pattern).
func (o *Observer) Wrap(mux http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		began := time.Now()
		rec := &recorder{ResponseWriter: w}
		mux.ServeHTTP(rec, r)
		route := r.Pattern
		if route == "" {
			route = Unmatched
		}
		status := rec.status
		if status == 0 {
			// A handler that wrote nothing answered 200.
			status = http.StatusOK
		}
		method := boundedMethod(r.Method)
		o.requests.WithLabelValues(route, method, strconv.Itoa(status)).Inc()
		o.duration.WithLabelValues(route).Observe(time.Since(began).Seconds())
		if o.rejected(route, status) {
			o.logRejection(r, route, method, status, rec.reason, rec.attrs)
		}
	})
}

// rejected tells the answers logged as rejections: every 4xx, and the
// retry-later 503 and 507, except the probes'.
func (o *Observer) rejected(route string, status int) bool {
	if slices.Contains(o.probes, route) {
		return false
	}
	return status >= 400 && status < 500 || status == http.StatusServiceUnavailable || status == http.StatusInsufficientStorage
}

// logRejection logs one rejected request, unless its (route, status) pair
// is over its rate. It logs what the client was told and where it came
// from, never the request's headers or body (the token, credentials).
func (o *Observer) logRejection(r *http.Request, route, method string, status int, reason string, noted []any) {
	ok, suppressed := o.limit.allow(rejectKey{route: route, status: status})
	if !ok {
		return
	}
	if reason == "" {
		reason = http.StatusText(status)
	}
	path := r.URL.Path
	if len(path) > 200 {
		path = path[:200] + "..."
	}
	attrs := []any{"route", route, "method", method, "path", path, "status", status, "reason", reason, "remote", r.RemoteAddr}
	attrs = append(attrs, noted...)
	if suppressed > 0 {
		attrs = append(attrs, "suppressed", suppressed)
	}
	// A wrong token, a refused job or an oversized body needs an
	// operator; an unknown job or a re-sent one is routine.
	level := slog.LevelWarn
	switch status {
	case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusConflict:
		level = slog.LevelInfo
	}
	o.logger.Log(r.Context(), level, "request rejected", attrs...)
}

// boundedMethod is the method label: the standard methods, or "other", so
// that a client cannot invent label values.
func boundedMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return m
	}
	return "other"
}

// recorder remembers the status a handler answered, the reason it noted
// and the attributes it added for the log line.
type recorder struct {
	http.ResponseWriter
	status int
	reason string
	attrs  []any
}

// WriteHeader implements http.ResponseWriter.
func (w *recorder) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

// Write implements http.ResponseWriter.
func (w *recorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush passes a flush on, for streaming answers.
func (w *recorder) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// NoteReason records why a request is rejected, for the one log line the
// observer writes about it.
func NoteReason(w http.ResponseWriter, reason string) {
	if rec, ok := w.(*recorder); ok {
		rec.reason = reason
	}
}

// NoteAttrs adds attributes (the job, the error behind the reason) to the
// line the observer logs if the request is rejected.
func NoteAttrs(w http.ResponseWriter, attrs ...any) {
	if rec, ok := w.(*recorder); ok {
		rec.attrs = append(rec.attrs, attrs...)
	}
}

// ServerWriter returns the server's own writer behind the observer, for
// http.MaxBytesReader: past its limit it tells the server to close the
// connection rather than read the rest of the body, through a method the
// observer cannot forward.
func ServerWriter(w http.ResponseWriter) http.ResponseWriter {
	if rec, ok := w.(*recorder); ok {
		return rec.ResponseWriter
	}
	return w
}

// rejectKey is what rejection lines are rate-limited by: both parts are
// bounded (patterns, status codes), so the limiter's map is too.
type rejectKey struct {
	route  string
	status int
}

// rejectLimiter lets through at most burst lines per key in each window
// and counts the others.
type rejectLimiter struct {
	burst  int
	window time.Duration
	now    func() time.Time

	mu   sync.Mutex
	keys map[rejectKey]*rejectCount
}

type rejectCount struct {
	start      time.Time
	logged     int
	suppressed int
}

func newRejectLimiter(burst int, window time.Duration, now func() time.Time) *rejectLimiter {
	return &rejectLimiter{burst: burst, window: window, now: now, keys: map[rejectKey]*rejectCount{}}
}

// allow tells whether a line for k may be logged now and, when it may, how
// many lines for k were left out since the last one logged.
func (l *rejectLimiter) allow(k rejectKey) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	c := l.keys[k]
	if c == nil {
		c = &rejectCount{start: now}
		l.keys[k] = c
	}
	if now.Sub(c.start) >= l.window {
		c.start, c.logged = now, 0
	}
	if c.logged >= l.burst {
		c.suppressed++
		return false, 0
	}
	c.logged++
	suppressed, c.suppressed = c.suppressed, 0
	return true, suppressed
}
