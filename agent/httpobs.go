package agent

import (
	"log/slog"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// unmatchedRoute is the route label of requests no pattern matched (404,
// 405): one value whatever the path, so that a scan of random URLs cannot
// grow the series without bound.
const unmatchedRoute = "unmatched"

// healthRoute answers readiness probes; its 503 is a probe's answer, with
// the reasons in the body, not a rejected request.
const healthRoute = "GET /health"

// Rejection logging: at most rejectBurst lines per (route, status) in each
// rejectWindow; the next line logged for that pair carries the count of
// lines left out.
const (
	rejectBurst  = 5
	rejectWindow = time.Minute
)

// BuildInfo identifies the running binary, for the build_info series;
// main passes what it was built with.
type BuildInfo struct {
	// Version is the release (set at build time), Revision the VCS
	// commit it was built from ("" when unknown).
	Version, Revision string
}

// newBuildInfo is the build_info gauge, always 1: its labels are the
// information, as node_exporter's.
func newBuildInfo(b BuildInfo) prometheus.Collector {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: namespace, Name: "build_info",
		Help: "Always 1; the labels name the running version, the VCS revision it was built from and the Go release.",
	}, []string{"version", "revision", "goversion"})
	g.WithLabelValues(b.Version, b.Revision, runtime.Version()).Set(1)
	return g
}

// httpMetrics count the API's requests by route.
type httpMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newHTTPMetrics() httpMetrics {
	return httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "http", Name: "requests_total",
			Help: "HTTP requests answered, by route (the API pattern, or unmatched), method and status code.",
		}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "http", Name: "request_duration_seconds",
			Help:    "Time from a request's headers to the end of its handler, by route.",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"route"}),
	}
}

func (m httpMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.duration}
}

// httpObserver counts every request and logs each rejected one once, at
// one place: handlers only answer (writeError notes the reason).
type httpObserver struct {
	metrics httpMetrics
	logger  *slog.Logger
	limit   *rejectLimiter
}

func newHTTPObserver(logger *slog.Logger) *httpObserver {
	return &httpObserver{metrics: newHTTPMetrics(), logger: logger.With("component", "http"),
		limit: newRejectLimiter(rejectBurst, rejectWindow, time.Now)}
}

// wrap observes the requests mux serves. It reads the matched pattern from
// the request after mux has served it (ServeMux sets Request.Pattern).
func (o *httpObserver) wrap(mux http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		began := time.Now()
		rec := &responseRecorder{ResponseWriter: w}
		mux.ServeHTTP(rec, r)
		route := r.Pattern
		if route == "" {
			route = unmatchedRoute
		}
		status := rec.status
		if status == 0 {
			// A handler that wrote nothing answered 200.
			status = http.StatusOK
		}
		method := boundedMethod(r.Method)
		o.metrics.requests.WithLabelValues(route, method, strconv.Itoa(status)).Inc()
		o.metrics.duration.WithLabelValues(route).Observe(time.Since(began).Seconds())
		if rejected(route, status) {
			o.logRejection(r, route, method, status, rec.reason, rec.attrs)
		}
	})
}

// rejected tells the answers logged as rejections: every 4xx, and the
// retry-later 503 and 507, except the probes' (/health, /livez, /readyz).
func rejected(route string, status int) bool {
	switch route {
	case healthRoute, "GET /livez", "GET /readyz":
		return false
	}
	return status >= 400 && status < 500 || status == http.StatusServiceUnavailable || status == http.StatusInsufficientStorage
}

// logRejection logs one rejected request, unless its (route, status) pair
// is over its rate. It logs what the client was told and where it came
// from, never the request's headers or body (the token, credentials).
func (o *httpObserver) logRejection(r *http.Request, route, method string, status int, reason string, noted []any) {
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

// responseRecorder remembers the status a handler answered, the reason
// writeError gave and what the handler noted for the log line.
type responseRecorder struct {
	http.ResponseWriter
	status int
	reason string
	attrs  []any
}

// WriteHeader implements http.ResponseWriter.
func (w *responseRecorder) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

// Write implements http.ResponseWriter.
func (w *responseRecorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush passes a flush on, for streaming answers.
func (w *responseRecorder) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *responseRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// noteReason records why a request is rejected, for the one log line the
// observer writes about it.
func noteReason(w http.ResponseWriter, reason string) {
	if rec, ok := w.(*responseRecorder); ok {
		rec.reason = reason
	}
}

// noteAttrs adds attributes (the job, the error behind the reason) to the
// line the observer logs if the request is rejected.
func noteAttrs(w http.ResponseWriter, attrs ...any) {
	if rec, ok := w.(*responseRecorder); ok {
		rec.attrs = append(rec.attrs, attrs...)
	}
}

// serverWriter returns the server's own writer behind the recorder, for
// http.MaxBytesReader: past its limit it tells the server to close the
// connection rather than read the rest of the body, through a method the
// recorder cannot forward.
func serverWriter(w http.ResponseWriter) http.ResponseWriter {
	if rec, ok := w.(*responseRecorder); ok {
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
