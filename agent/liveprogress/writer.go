package liveprogress

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
)

// KeyPrefix starts every progress key; the job ID follows.
const KeyPrefix = "template_image_job_pull_progress:"

// KeyTTL is the lifetime every write gives a progress key.
const KeyTTL = time.Hour

// Defaults for Options left zero.
const (
	DefaultMinInterval = 800 * time.Millisecond
	DefaultTimeout     = time.Second
	DefaultMaxJobs     = 1024
)

const (
	// maxBackoff caps the wait before retrying after a failed round trip.
	maxBackoff = 5 * time.Second
	// logEvery is the least time between two logged failures.
	logEvery = time.Minute
	// namespace and subsystem name the metrics.
	namespace = "cube_templatecenter"
	subsystem = "redis"
)

// Key returns the progress key of a job.
func Key(jobID string) string { return KeyPrefix + jobID }

// Options locate CubeMaster's Redis and shape the writes.
type Options struct {
	// Nodes are host:port addresses: one is a single server, several a
	// cluster.
	Nodes []string
	// Password is the default user's password; empty for none.
	Password string
	// DB is the database number; a cluster has 0 only.
	DB int
	// TLS, when not nil, reaches every node over TLS; an empty ServerName
	// means each node's host.
	TLS *tls.Config
	// MinInterval is the least time between two writes of one job's hash;
	// DefaultMinInterval when zero.
	MinInterval time.Duration
	// Timeout bounds one round trip to Redis (dial included);
	// DefaultTimeout when zero.
	Timeout time.Duration
	// MaxJobs bounds the jobs with unsent progress or a pending deletion;
	// values for further jobs are dropped. DefaultMaxJobs when zero.
	MaxJobs int
}

// String shows where the options lead, never the password.
func (o Options) String() string {
	return fmt.Sprintf("redis://%s/%d", strings.Join(o.Nodes, ","), o.DB)
}

// GoString is String, for %#v.
func (o Options) GoString() string { return o.String() }

// LogValue is String, for slog.
func (o Options) LogValue() slog.Value { return slog.StringValue(o.String()) }

// writeScript sets the hash fields (ARGV[2:]) and the TTL (ARGV[1]) in one
// step, so no key is ever left without a TTL.
var writeScript = redis.NewScript(`redis.call('HSET', KEYS[1], unpack(ARGV, 2))
return redis.call('EXPIRE', KEYS[1], ARGV[1])`)

// Writer sends the live pull progress of jobs to Redis in the
// background. Its methods are safe for concurrent use.
type Writer struct {
	client redis.UniversalClient
	logger *slog.Logger
	opts   Options

	mu     sync.Mutex
	jobs   map[string]*entry
	closed bool

	wake   chan struct{} // a value is waiting; capacity 1
	drain  chan struct{} // closed by Close: one last round, then exit
	cancel context.CancelFunc
	done   chan struct{}

	// Owned by the worker goroutine.
	backoff  time.Duration
	retryAt  time.Time
	lastLog  time.Time
	failing  bool
	unlogged int

	writes, deletes, failures prometheus.Counter
	dropped                   *prometheus.CounterVec
	pending                   prometheus.GaugeFunc
}

// entry is what the writer holds for one job.
type entry struct {
	// latest is the newest value; dirty says it is not written yet.
	latest api.Pull
	dirty  bool
	// last is when the job's hash was last sent, for the rate limit.
	last time.Time
	// finish asks for final (when set) to be written and the key deleted,
	// before any later value; finishedAt bounds how long that is retried.
	finish     bool
	final      *api.Pull
	finishedAt time.Time
}

// op is one job's share of a round trip: write, then delete.
type op struct {
	job   string
	write *api.Pull
	// at is when the round trip was made: the hash's updated_at_ms, so
	// two values CubeMaster reads are MinInterval apart, as the writes.
	at  time.Time
	del bool
	// finishedAt is carried so that a failed deletion keeps its deadline.
	finishedAt time.Time
	// writeCmd and delCmd are the queued commands; err is set when the
	// whole round trip failed.
	writeCmd, delCmd redis.Cmder
	err              error
}

// cmdErr returns the error of a queued command (none for nil).
func (o *op) cmdErr(c redis.Cmder) error {
	if c == nil {
		return nil
	}
	return cmp.Or(o.err, c.Err())
}

// New returns a writer to the given Redis and starts its goroutine. It
// does not connect: a Redis that is down at start is retried in the
// background (see Ping). Errors are for options that cannot work.
func New(opts Options, logger *slog.Logger) (*Writer, error) {
	if len(opts.Nodes) == 0 {
		return nil, errors.New("liveprogress: no redis nodes")
	}
	if opts.DB < 0 || (opts.DB != 0 && len(opts.Nodes) > 1) {
		return nil, fmt.Errorf("liveprogress: database %d with %d nodes: a cluster has database 0 only", opts.DB, len(opts.Nodes))
	}
	if opts.MinInterval < 0 || opts.Timeout < 0 || opts.MaxJobs < 0 {
		return nil, errors.New("liveprogress: negative MinInterval, Timeout or MaxJobs")
	}
	if opts.MinInterval == 0 {
		opts.MinInterval = DefaultMinInterval
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.MaxJobs == 0 {
		opts.MaxJobs = DefaultMaxJobs
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	client := redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs:     opts.Nodes,
		Password:  opts.Password,
		DB:        opts.DB,
		TLSConfig: opts.TLS,
		// The worker retries on its own schedule, with the latest value.
		MaxRetries:            -1,
		DialTimeout:           opts.Timeout,
		ReadTimeout:           opts.Timeout,
		WriteTimeout:          opts.Timeout,
		ContextTimeoutEnabled: true,
		// One worker and the odd Ping. go-redis logs each failed dial
		// until PoolSize of them fail in a row: keep that small too.
		PoolSize:                 2,
		DialerRetries:            1,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	ctx, cancel := context.WithCancel(context.Background())
	p := &Writer{
		client: client,
		logger: logger,
		opts:   opts,
		jobs:   map[string]*entry{},
		wake:   make(chan struct{}, 1),
		drain:  make(chan struct{}),
		cancel: cancel,
		done:   make(chan struct{}),
		writes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "progress_writes_total",
			Help: "Pull progress hashes written to CubeMaster's Redis.",
		}),
		deletes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "progress_deletes_total",
			Help: "Pull progress keys deleted from CubeMaster's Redis after their job's pull ended.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "progress_failures_total",
			Help: "Pull progress writes and deletes Redis did not acknowledge; retried with the latest value.",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "progress_dropped_total",
			Help: "Pull progress updates or deletes given up, by reason (full: too many jobs pending; expired: a delete retried past the key's TTL).",
		}, []string{"reason"}),
	}
	p.pending = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: subsystem, Name: "progress_pending_jobs",
		Help: "Jobs with pull progress or a delete waiting to be sent to Redis.",
	}, func() float64 {
		p.mu.Lock()
		defer p.mu.Unlock()
		return float64(len(p.jobs))
	})
	for _, r := range []string{"full", "expired"} {
		p.dropped.WithLabelValues(r)
	}
	go p.run(ctx)
	return p, nil
}

// Collectors returns the writer's metrics, for the caller's registry.
func (p *Writer) Collectors() []prometheus.Collector {
	if p == nil {
		return nil
	}
	return []prometheus.Collector{p.writes, p.deletes, p.failures, p.dropped, p.pending}
}

// Update records a job's latest pull progress, to be written within
// MinInterval. It never blocks on Redis and never fails: when Redis cannot
// be reached the value waits, replaced by any later one.
func (p *Writer) Update(jobID string, pull api.Pull) {
	if p == nil || jobID == "" {
		return
	}
	p.mu.Lock()
	e := p.entryLocked(jobID)
	if e != nil {
		e.latest, e.dirty = pull, true
	}
	p.mu.Unlock()
	if e != nil {
		p.signal()
	}
}

// Finish ends a job's live progress: its last value is written at once,
// then its key is deleted. It never blocks on Redis; a deletion that fails
// is retried until it succeeds or the key has expired.
func (p *Writer) Finish(jobID string) {
	if p == nil || jobID == "" {
		return
	}
	now := time.Now()
	p.mu.Lock()
	e := p.entryLocked(jobID)
	if e != nil {
		if e.dirty {
			final := e.latest
			e.final, e.dirty = &final, false
		}
		if !e.finish {
			e.finish, e.finishedAt = true, now
		}
	}
	p.mu.Unlock()
	if e != nil {
		p.signal()
	}
}

// entryLocked returns the job's entry, creating it when there is room; nil
// when the writer is closed or full. p.mu must be held.
func (p *Writer) entryLocked(jobID string) *entry {
	if p.closed {
		return nil
	}
	e := p.jobs[jobID]
	if e == nil {
		if len(p.jobs) >= p.opts.MaxJobs {
			p.dropped.WithLabelValues("full").Inc()
			return nil
		}
		e = &entry{}
		p.jobs[jobID] = e
	}
	return e
}

func (p *Writer) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Ping checks that Redis answers, within ctx and Options.Timeout. A nil
// writer has nothing to reach and answers nil.
func (p *Writer) Ping(ctx context.Context) error {
	if p == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.Timeout)
	defer cancel()
	if err := p.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("ping redis %s: %w", strings.Join(p.opts.Nodes, ","), err)
	}
	return nil
}

// Close stops the writer: later Updates and Finishes are ignored,
// pending deletions get one last attempt, and the goroutine is waited for
// until ctx ends, when the attempt is abandoned. It returns ctx's error
// when it had to abandon it, else the client's Close error.
func (p *Writer) Close(ctx context.Context) error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	already := p.closed
	p.closed = true
	p.mu.Unlock()
	if already {
		<-p.done
		return nil
	}
	close(p.drain)
	var err error
	select {
	case <-p.done:
	case <-ctx.Done():
		err = fmt.Errorf("close redis publisher: %w", ctx.Err())
	}
	p.cancel()
	// Closing the client also ends a round trip stuck in a read.
	if cerr := p.client.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close redis client: %w", cerr)
	}
	<-p.done
	return err
}

// run is the worker: it sends what is due, then sleeps until the next
// value is due or a new one arrives.
func (p *Writer) run(ctx context.Context) {
	defer close(p.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		ops, next := p.due(time.Now(), false)
		if len(ops) > 0 {
			p.send(ctx, ops)
			continue
		}
		var tick <-chan time.Time
		if !next.IsZero() {
			timer.Reset(max(time.Until(next), time.Millisecond))
			tick = timer.C
		}
		select {
		case <-p.wake:
		case <-tick:
		case <-p.drain:
			if ops, _ := p.due(time.Now(), true); len(ops) > 0 {
				p.send(ctx, ops)
			}
			return
		case <-ctx.Done():
			return
		}
	}
}

// due takes the work that is due at now out of the entries and returns
// it, with the time more becomes due (zero for never). closing takes only
// the pending deletions, ignoring the backoff.
func (p *Writer) due(now time.Time, closing bool) ([]*op, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ops []*op
	var next time.Time
	later := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for job, e := range p.jobs {
		if e.finish && now.Sub(e.finishedAt) >= KeyTTL {
			// Every write before Finish gave the key at most KeyTTL: it
			// is gone by now.
			e.finish, e.final = false, nil
			p.dropped.WithLabelValues("expired").Inc()
		}
		if !e.dirty && !e.finish {
			if now.Sub(e.last) >= p.opts.MinInterval {
				delete(p.jobs, job)
			}
			continue
		}
		if !closing && now.Before(p.retryAt) {
			later(p.retryAt)
			continue
		}
		switch {
		case e.finish:
			ops = append(ops, &op{job: job, write: e.final, at: now, del: true, finishedAt: e.finishedAt})
			e.finish, e.final = false, nil
			e.last = now
		case closing:
		case now.Sub(e.last) >= p.opts.MinInterval:
			pull := e.latest
			ops = append(ops, &op{job: job, write: &pull, at: now})
			e.dirty, e.last = false, now
		default:
			later(e.last.Add(p.opts.MinInterval))
		}
	}
	return ops, next
}

// send makes one round trip with every op, then accounts for each.
func (p *Writer) send(ctx context.Context, ops []*op) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.Timeout)
	defer cancel()
	pipe := p.client.Pipeline()
	ttl := strconv.Itoa(int(KeyTTL / time.Second))
	for _, o := range ops {
		key := Key(o.job)
		if o.write != nil {
			pl := o.write
			o.writeCmd = writeScript.Eval(ctx, pipe, []string{key}, ttl,
				"job_id", o.job,
				"pull_total_bytes", pl.TotalBytes,
				"pull_downloaded_bytes", pl.DownloadedBytes,
				"pull_total_layers", pl.TotalLayers,
				"pull_completed_layers", pl.CompletedLayers,
				"pull_speed_bps", pl.SpeedBPS,
				"updated_at_ms", o.at.UnixMilli())
		}
		if o.del {
			o.delCmd = pipe.Del(ctx, key)
		}
	}
	_, err := pipe.Exec(ctx)
	// A reply error belongs to its command; an error no command carries
	// (a failed dial or login) means none ran.
	if err != nil && !slices.ContainsFunc(ops, func(o *op) bool {
		return o.cmdErr(o.writeCmd) != nil || o.cmdErr(o.delCmd) != nil
	}) {
		for _, o := range ops {
			o.err = err
		}
	}
	p.settle(ops)
}

// settle counts the outcome of each op and puts back what failed, unless
// something newer has replaced it meanwhile.
func (p *Writer) settle(ops []*op) {
	var firstErr error
	failed := 0
	p.mu.Lock()
	for _, o := range ops {
		err := o.cmdErr(o.writeCmd)
		if o.writeCmd != nil && err == nil {
			p.writes.Inc()
		}
		if err == nil && o.delCmd != nil {
			if err = o.cmdErr(o.delCmd); err == nil {
				p.deletes.Inc()
			}
		}
		if err == nil {
			if e := p.jobs[o.job]; o.del && e != nil && !e.dirty && !e.finish {
				delete(p.jobs, o.job) // done with: no rate to keep
			}
			continue
		}
		failed++
		p.failures.Inc()
		firstErr = cmp.Or(firstErr, fmt.Errorf("job %s: %w", o.job, err))
		e := p.jobs[o.job]
		if e == nil {
			e = &entry{}
			p.jobs[o.job] = e
		}
		switch {
		case o.del && !e.finish:
			e.finish, e.final, e.finishedAt = true, o.write, o.finishedAt
		case o.del: // finished again meanwhile: its own final value wins
		case e.finish:
			// Finished while this write was on its way: the value is the
			// final one, sent before the deletion, never after it.
			if e.final == nil {
				e.final = o.write
			}
		case !e.dirty:
			e.latest, e.dirty = *o.write, true
		}
	}
	p.mu.Unlock()
	p.account(failed, firstErr)
}

// account sets the backoff after a round trip and logs failures at most
// once per logEvery, and the recovery after a logged failure.
func (p *Writer) account(failed int, err error) {
	now := time.Now()
	if failed == 0 {
		if p.failing {
			p.logger.Info("redis accepts pull progress again", "unlogged_failures", p.unlogged)
		}
		p.backoff, p.retryAt, p.failing, p.unlogged = 0, time.Time{}, false, 0
		return
	}
	p.backoff = min(max(2*p.backoff, min(p.opts.MinInterval, maxBackoff)), maxBackoff)
	p.retryAt = now.Add(p.backoff)
	if !p.lastLog.IsZero() && now.Sub(p.lastLog) < logEvery {
		p.unlogged += failed
		return
	}
	p.logger.Warn("publish pull progress to redis", "err", err, "failed", failed,
		"unlogged_failures", p.unlogged, "retry_in", p.backoff)
	p.lastLog, p.failing, p.unlogged = now, true, 0
}
