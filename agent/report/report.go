// Package report delivers the spool's outbox of status reports to
// CubeMaster: strictly in order per job, retried with capped exponential
// backoff on transport errors, 408, 429 and 5xx, terminal reports until they
// are delivered, and dropped only on an answer that can never succeed.
package report

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// Outbox is the part of the spool the reporter drains.
type Outbox interface {
	DueReports(ctx context.Context, now time.Time, limit int) ([]spool.Report, error)
	DueReportOf(ctx context.Context, jobID string, now time.Time) (spool.Report, bool, error)
	NextDue(ctx context.Context) (time.Time, bool, error)
	RemoveReport(ctx context.Context, id int64) error
	RetryReport(ctx context.Context, id int64, next time.Time, lastErr string) error
}

// Settings are read before every attempt, so a reload takes effect at once.
type Settings struct {
	// BaseURL is CubeMaster's address; the job path is appended.
	BaseURL string
	// Token is sent in the shared-token header when not empty.
	Token            string
	Timeout          time.Duration
	RetryInitial     time.Duration
	RetryMax         time.Duration
	ProgressAttempts int
}

// Outcomes of one delivery attempt, as counted in metrics.
const (
	OutcomeDelivered = "delivered"
	OutcomeRetry     = "retry"
	OutcomeDropped   = "dropped"
)

// Observer is told about every attempt; the agent turns it into metrics.
type Observer func(outcome string, terminal bool)

// Reporter posts reports from an Outbox.
type Reporter struct {
	outbox   Outbox
	settings func() Settings
	client   *http.Client
	logger   *slog.Logger
	observe  Observer
	tracer   trace.Tracer
	wake     chan struct{}
	// workers bounds concurrent deliveries (to different jobs).
	workers int
	now     func() time.Time
	// holds remembers reports whose outbox bookkeeping failed (a full or
	// failing spool disk): until it lands, the outbox still shows them
	// due, and only this keeps them from being sent again at once.
	holdMu sync.Mutex
	holds  map[int64]*hold
	// failLog rate-limits the errors of a spool that keeps failing.
	failLog *limiter
	// checkedURL is the BaseURL CheckTransport last looked at.
	checkedMu  sync.Mutex
	checkedURL string

	// Beat, when set before Run, is called at each round of Run, each look
	// at the outbox and each delivery attempt, for a liveness probe: a
	// reporter busy with a slow CubeMaster still goes round once per
	// callback timeout.
	Beat func()
}

// hold is what the reporter remembers of a report whose bookkeeping in the
// outbox failed.
type hold struct {
	// until: the report is not looked at again before.
	until time.Time
	// settled: it was delivered (or dropped); only its removal is owed,
	// never another POST while the process runs.
	settled bool
	// failures counts bookkeeping failures in a row, for the backoff.
	failures int
	// attempts counts delivery attempts the outbox did not record.
	attempts int
}

// staleHold is how long a hold outlives its end when its report never
// comes up again (superseded or removed meanwhile).
const staleHold = time.Hour

// minLook is the shortest wait between two looks at an outbox whose due
// reports are all held, so that no state the reporter did not foresee can
// turn the loop into a spin.
const minLook = 50 * time.Millisecond

// failLogEvery is the interval at which one kind of bookkeeping failure
// is logged; the lines in between are counted, not written.
const failLogEvery = 10 * time.Second

// New returns a reporter; call Run to start delivering. Terminal reports
// get a span per attempt from tp (nil: none).
func New(outbox Outbox, settings func() Settings, logger *slog.Logger, observe Observer, tp trace.TracerProvider) *Reporter {
	if observe == nil {
		observe = func(string, bool) {}
	}
	const workers = 4
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// Every worker keeps its connection to CubeMaster between reports
	// (the default keeps two per host), so no report waits for a new one.
	tr.MaxIdleConnsPerHost = workers
	return &Reporter{
		outbox:   outbox,
		settings: settings,
		client: &http.Client{
			Transport: tr,
			// A redirect would carry the shared token and the report to
			// whatever host the answer names: never follow one.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		logger:  logger,
		observe: observe,
		tracer:  tracerOf(tp),
		wake:    make(chan struct{}, 1),
		workers: workers,
		now:     time.Now,
		holds:   map[int64]*hold{},
		failLog: newLimiter(failLogEvery),
	}
}

// CheckTransport warns, once per CubeMaster address, when the shared token
// would travel in clear text across a network (see PlainHTTPHost). It runs
// at start, and again after a reload, which may change the address.
func (r *Reporter) CheckTransport() {
	s := r.settings()
	r.checkedMu.Lock()
	defer r.checkedMu.Unlock()
	if s.BaseURL == r.checkedURL {
		return
	}
	r.checkedURL = s.BaseURL
	if host, plain := PlainHTTPHost(s.BaseURL, s.Token); plain {
		r.logger.Warn("the shared token goes to CubeMaster over plain http to a host that is not loopback; "+
			"anyone on the path can read it: use https in master.addr", "host", host)
	}
}

// PlainHTTPHost returns the host of baseURL and true when a token is set
// and baseURL is http:// to a host other than loopback (localhost, 127/8,
// ::1), where the token can be read on the wire.
func PlainHTTPHost(baseURL, token string) (string, bool) {
	u, err := url.Parse(baseURL)
	if err != nil || strings.TrimSpace(token) == "" || !strings.EqualFold(u.Scheme, "http") {
		return "", false
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return host, false
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.Unmap().IsLoopback() {
		return host, false
	}
	return host, true
}

// Wake tells the reporter new reports are waiting.
func (r *Reporter) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

func (r *Reporter) beat() {
	if r.Beat != nil {
		r.Beat()
	}
}

// Run delivers reports until ctx ends.
func (r *Reporter) Run(ctx context.Context) {
	failures := 0
	r.CheckTransport()
	for {
		r.beat()
		if err := r.DeliverDue(ctx); err != nil && ctx.Err() == nil {
			failures++
			r.logFailure(r.logger, "deliver reports", "err", err)
		} else {
			failures = 0
		}
		timer := time.NewTimer(r.nextLook(ctx, failures))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-r.wake:
		case <-timer.C:
		}
		timer.Stop()
	}
}

// nextLook is the wait before the next look at the outbox: backing off
// while reading it fails, until the earliest due report otherwise, and
// until the earliest hold ends when every due report is held.
func (r *Reporter) nextLook(ctx context.Context, failures int) time.Duration {
	if failures > 0 {
		s := r.settings()
		return backoff(failures-1, s.RetryInitial, s.RetryMax)
	}
	next, ok, err := r.outbox.NextDue(ctx)
	if err != nil || !ok {
		return time.Minute
	}
	now := r.now()
	wait := next.Sub(now)
	if wait > 0 {
		return min(wait, time.Minute)
	}
	// DeliverDue returned with reports due: they are all held.
	if end, ok := r.holdsEnd(); ok {
		wait = end.Sub(now)
	}
	return min(max(wait, minLook), time.Minute)
}

// DeliverDue sends every report that is due, job queues in parallel (at
// most workers at a time) and each job's reports in order, until nothing
// more is due. A job's reports follow one another on one worker, each as
// soon as the one before it was accepted: neither a slow CubeMaster answer
// to one job nor a fresh look at the whole outbox holds up another job's
// next report, and reports queued meanwhile (Wake) start at once.
func (r *Reporter) DeliverDue(ctx context.Context) error {
	sem := make(chan struct{}, r.workers)
	ended := make(chan struct{}, r.workers)
	var wg sync.WaitGroup
	defer wg.Wait()
	var mu sync.Mutex
	busy := map[string]bool{} // jobs whose reports a worker is sending
	// recent holds the jobs whose worker ended since the last look at the
	// outbox: that look may predate what the worker recorded (a retry's
	// next attempt), so they wait for the next one.
	recent := map[string]bool{}
	for ctx.Err() == nil {
		r.beat()
		mu.Lock()
		clear(recent)
		mu.Unlock()
		// Held reports head the due list (their recorded next attempt
		// is old): read past them.
		due, err := r.outbox.DueReports(ctx, r.now(), 64+r.held())
		if err != nil {
			return err
		}
		started := 0
		for _, rep := range due {
			if r.waiting(rep.ID) {
				continue
			}
			mu.Lock()
			if busy[rep.JobID] || recent[rep.JobID] {
				mu.Unlock()
				continue
			}
			busy[rep.JobID] = true
			mu.Unlock()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return ctx.Err()
			}
			started++
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.deliverJob(ctx, rep)
				mu.Lock()
				delete(busy, rep.JobID)
				recent[rep.JobID] = true
				mu.Unlock()
				<-sem
				select {
				case ended <- struct{}{}:
				default:
				}
			}()
		}
		mu.Lock()
		running, finished := len(busy), len(recent)
		mu.Unlock()
		if started > 0 || finished > 0 {
			continue
		}
		if running == 0 {
			return ctx.Err()
		}
		// Everything due is on its way: look again when a job's reports
		// end (a retry may be due later, another job's next) or new ones
		// are queued.
		select {
		case <-ended:
		case <-r.wake:
		case <-ctx.Done():
		}
	}
	return ctx.Err()
}

// deliverJob sends rep, then the job's following reports while each is
// delivered (or dropped) and the next is due.
func (r *Reporter) deliverJob(ctx context.Context, rep spool.Report) {
	for r.attempt(ctx, rep) && ctx.Err() == nil {
		r.beat()
		next, due, err := r.outbox.DueReportOf(ctx, rep.JobID, r.now())
		if err != nil {
			if ctx.Err() == nil {
				r.logFailure(r.logger, "read next report", "job_id", rep.JobID, "err", err)
			}
			return
		}
		if !due || r.waiting(next.ID) {
			return
		}
		rep = next
	}
}

// attempt handles rep once its hold, if any, has ended: a report already
// delivered is only removed, never sent again; one whose retry the outbox
// did not record is retried with the attempts it missed.
func (r *Reporter) attempt(ctx context.Context, rep spool.Report) bool {
	r.holdMu.Lock()
	h := r.holds[rep.ID]
	var settled bool
	if h != nil {
		settled = h.settled
		rep.Attempts += h.attempts
	}
	r.holdMu.Unlock()
	if settled {
		log := r.logger.With("job_id", rep.JobID, "report", rep.Kind)
		return r.remove(ctx, log, rep, "remove delivered report")
	}
	return r.deliver(ctx, rep)
}

// remove takes a delivered or dropped report out of the outbox. When that
// fails the report is held as settled, with a backoff before the next try.
func (r *Reporter) remove(ctx context.Context, log *slog.Logger, rep spool.Report, op string) bool {
	if err := r.outbox.RemoveReport(context.WithoutCancel(ctx), rep.ID); err != nil {
		d := r.hold(rep.ID, true, false)
		r.logFailure(log, op, "err", err, "next_try_in", d)
		return false
	}
	r.release(rep.ID)
	return true
}

// hold records a bookkeeping failure for report id and returns the wait
// before it is looked at again: the retry backoff, counted in failures in
// a row. attempted marks a delivery attempt the outbox did not record.
func (r *Reporter) hold(id int64, settled, attempted bool) time.Duration {
	s := r.settings()
	r.holdMu.Lock()
	defer r.holdMu.Unlock()
	h := r.holds[id]
	if h == nil {
		h = &hold{}
		r.holds[id] = h
	}
	h.settled = h.settled || settled
	if attempted {
		h.attempts++
	}
	d := backoff(h.failures, s.RetryInitial, s.RetryMax)
	h.failures++
	h.until = r.now().Add(d)
	return d
}

// release forgets report id: its bookkeeping landed.
func (r *Reporter) release(id int64) {
	r.holdMu.Lock()
	delete(r.holds, id)
	r.holdMu.Unlock()
}

// waiting reports whether report id is held and its hold has not ended.
func (r *Reporter) waiting(id int64) bool {
	r.holdMu.Lock()
	defer r.holdMu.Unlock()
	h := r.holds[id]
	return h != nil && r.now().Before(h.until)
}

// held counts the reports held, first forgetting those whose hold ended
// long ago: their report did not come up again, so it left the outbox.
func (r *Reporter) held() int {
	r.holdMu.Lock()
	defer r.holdMu.Unlock()
	stale := r.now().Add(-staleHold)
	for id, h := range r.holds {
		if h.until.Before(stale) {
			delete(r.holds, id)
		}
	}
	return len(r.holds)
}

// holdsEnd returns when the earliest hold ends; false when none is held.
func (r *Reporter) holdsEnd() (time.Time, bool) {
	r.holdMu.Lock()
	defer r.holdMu.Unlock()
	var end time.Time
	for _, h := range r.holds {
		if end.IsZero() || h.until.Before(end) {
			end = h.until
		}
	}
	return end, !end.IsZero()
}

// logFailure logs a bookkeeping failure unless one of the same kind was
// logged within failLogEvery; the next line counts those held back.
func (r *Reporter) logFailure(log *slog.Logger, msg string, args ...any) {
	ok, suppressed := r.failLog.allow(msg, r.now())
	if !ok {
		return
	}
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	log.Error(msg, args...)
}

// limiter lets one event per kind through per interval and counts the
// others.
type limiter struct {
	every      time.Duration
	mu         sync.Mutex
	last       map[string]time.Time
	suppressed map[string]int
}

func newLimiter(every time.Duration) *limiter {
	return &limiter{every: every, last: map[string]time.Time{}, suppressed: map[string]int{}}
}

// allow reports whether an event of kind may be logged at now, and how many
// were held back since the last one that was.
func (l *limiter) allow(kind string, now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if last, ok := l.last[kind]; ok && now.Sub(last) < l.every {
		l.suppressed[kind]++
		return false, 0
	}
	n := l.suppressed[kind]
	l.last[kind] = now
	delete(l.suppressed, kind)
	return true, n
}

// deliver makes one attempt and records its outcome in the outbox. It
// reports whether the report left the outbox (delivered or dropped), so
// the job's next one may follow.
func (r *Reporter) deliver(ctx context.Context, rep spool.Report) bool {
	s := r.settings()
	log := r.logger.With("job_id", rep.JobID, "report", rep.Kind, "attempt", rep.Attempts+1)
	ctx, span := r.traceContext(ctx, rep)
	status, body, err := r.post(ctx, s, rep)
	endAttempt(span, status, err, fmt.Sprintf("HTTP %d", status))
	// Bookkeeping must land even if ctx ends now.
	store := context.WithoutCancel(ctx)
	if err == nil && status/100 == 2 {
		r.observe(OutcomeDelivered, rep.Terminal)
		log.Debug("report delivered", "status", status)
		return r.remove(ctx, log, rep, "remove delivered report")
	}
	if ctx.Err() != nil {
		return false // stopping: the report stays in the outbox as it was
	}
	switch {
	case err == nil && !retryable(status):
		r.observe(OutcomeDropped, rep.Terminal)
		log.Error("report refused by CubeMaster, dropping it", "status", status, "body", snippet(body))
		return r.remove(ctx, log, rep, "remove refused report")
	}
	reason := fmt.Sprintf("HTTP %d: %s", status, snippet(body))
	if err != nil {
		reason = err.Error()
	}
	if !rep.Terminal && rep.Attempts+1 >= s.ProgressAttempts {
		r.observe(OutcomeDropped, false)
		log.Warn("giving up on progress report", "err", reason)
		return r.remove(ctx, log, rep, "remove abandoned report")
	}
	r.observe(OutcomeRetry, rep.Terminal)
	delay := backoff(rep.Attempts, s.RetryInitial, s.RetryMax)
	level := slog.LevelWarn
	if !rep.Terminal {
		level = slog.LevelInfo
	}
	log.Log(ctx, level, "report not delivered, will retry", "err", reason, "retry_in", delay)
	r.recordBackoff(store, rep, delay)
	if err := r.outbox.RetryReport(store, rep.ID, r.now().Add(delay), reason); err != nil {
		// The outbox still shows the report due now: hold it in memory
		// for at least the delay it was meant to wait.
		d := max(r.hold(rep.ID, false, true), delay)
		r.holdMu.Lock()
		r.holds[rep.ID].until = r.now().Add(d)
		r.holdMu.Unlock()
		r.logFailure(log, "reschedule report", "err", err, "next_try_in", d)
		return false
	}
	r.release(rep.ID)
	return false
}

// retryable reports whether an HTTP status may succeed later.
func retryable(status int) bool {
	return status == http.StatusRequestTimeout || status == http.StatusTooManyRequests || status >= 500
}

// backoff is the wait before attempt number attempts+1: initial doubled per
// earlier attempt, capped at max.
func backoff(attempts int, initial, maxDelay time.Duration) time.Duration {
	d := initial
	for i := 0; i < attempts && d < maxDelay; i++ {
		d *= 2
	}
	return min(d, maxDelay)
}

func (r *Reporter) post(ctx context.Context, s Settings, rep spool.Report) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	target := strings.TrimRight(s.BaseURL, "/") + "/internal/template/jobs/" + url.PathEscape(rep.JobID) + "/status"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(rep.Body))
	if err != nil {
		return 0, nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	setTraceHeaders(ctx, req.Header)
	if strings.TrimSpace(s.Token) != "" {
		req.Header.Set(api.TokenHeader, strings.TrimSpace(s.Token))
	}
	resp, err := r.client.Do(req)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // the URL is logged separately; keep the cause
		}
		return 0, nil, fmt.Errorf("post to %s: %w", safetext.URL(s.BaseURL), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 == 3 {
		return 0, nil, fmt.Errorf("post to %s: HTTP %d redirects to %s; callbacks never follow redirects", safetext.URL(s.BaseURL), resp.StatusCode, safetext.Name(safetext.URL(resp.Header.Get("Location"))))
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, body, nil
}

// snippet is the start of a refusal's body, for a log line and the
// report's last error: CubeMaster's answer, or whatever answered in its
// place.
func snippet(b []byte) string {
	return safetext.Clip(strings.TrimSpace(string(b)), 200)
}
