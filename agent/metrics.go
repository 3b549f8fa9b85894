package agent

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/cubesandbox/cubetemplatecenter/agent/report"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
)

const namespace = "cube_templatecenter"

// spoolScrapeTimeout bounds the spool queries of one scrape.
const spoolScrapeTimeout = 2 * time.Second

// metrics are the daemon's Prometheus series, on a private registry.
// Subsystems: jobs (the life of build jobs), build (the image work),
// callback (reports to CubeMaster), queue and outbox (spool depths, with
// spool_scrape_success), layer_cache, blobstore and, with a database,
// replica and reconcile. The build and artifacts packages register their
// own through scoped.
type metrics struct {
	registry *prometheus.Registry
	// collectors are all the registry holds, in registration order.
	collectors []prometheus.Collector
	accepted   prometheus.Counter
	callbacks  *prometheus.CounterVec
	// reloadOK and reloadTime are the last configuration reload's outcome
	// and when one last succeeded (the start counts as one).
	reloadOK, reloadTime prometheus.Gauge
}

// spoolCounts is what the spool collector reads at scrape time.
type spoolCounts interface {
	Counts(ctx context.Context) (queued, running int, err error)
	OutboxDepth(ctx context.Context) (int, error)
	OldestReport(ctx context.Context) (time.Time, bool, error)
}

func newMetrics(sp spoolCounts, logger *slog.Logger) *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		accepted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "jobs", Name: "accepted_total",
			Help: "Build jobs accepted and committed to the spool.",
		}),
		callbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "callback", Name: "attempts_total",
			Help: "Status report deliveries to CubeMaster, by outcome (delivered, retry, dropped) and kind.",
		}, []string{"outcome", "kind"}),
		reloadOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: "config", Name: "last_reload_successful",
			Help: "Whether the last configuration reload succeeded (1) or was refused, keeping the running configuration (0).",
		}),
		reloadTime: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: "config", Name: "last_reload_success_timestamp_seconds",
			Help: "When the configuration was last loaded successfully, at start or by a reload, in seconds since the epoch.",
		}),
	}
	m.observeReload(true)
	// Every series exists from the start, at zero, so a rate over a
	// process's life needs no absent() guard.
	for _, outcome := range []string{report.OutcomeDelivered, report.OutcomeRetry, report.OutcomeDropped} {
		for _, kind := range []string{callbackProgress, callbackTerminal} {
			m.callbacks.WithLabelValues(outcome, kind)
		}
	}
	m.register(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.accepted, m.callbacks, m.reloadOK, m.reloadTime,
		newSpoolCollector(sp, logger, spoolScrapeTimeout),
	)
	return m
}

// observeReload records a configuration load's outcome.
func (m *metrics) observeReload(ok bool) {
	if !ok {
		m.reloadOK.Set(0)
		return
	}
	m.reloadOK.Set(1)
	m.reloadTime.SetToCurrentTime()
}

// register adds collectors to the registry; it panics on a duplicate, as
// only a programming error causes one.
func (m *metrics) register(cs ...prometheus.Collector) {
	trackingRegisterer{m}.MustRegister(cs...)
}

// scoped is the Registerer a component registers its series with: their
// names get the namespace, and the registry tracks them as register does.
func (m *metrics) scoped() prometheus.Registerer {
	return prometheus.WrapRegistererWithPrefix(namespace+"_", trackingRegisterer{m})
}

// trackingRegisterer registers with the registry and records what it
// registered in collectors.
type trackingRegisterer struct{ m *metrics }

// Register implements prometheus.Registerer.
func (t trackingRegisterer) Register(c prometheus.Collector) error {
	if err := t.m.registry.Register(c); err != nil {
		return err
	}
	t.m.collectors = append(t.m.collectors, c)
	return nil
}

// MustRegister implements prometheus.Registerer.
func (t trackingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := t.Register(c); err != nil {
			panic(err)
		}
	}
}

// Unregister implements prometheus.Registerer.
func (t trackingRegisterer) Unregister(c prometheus.Collector) bool {
	return t.m.registry.Unregister(c)
}

// spoolCollector reads the spool's depths once per scrape. A failed read
// is logged once, here, and shows as spool_scrape_success 0 with the depth
// it could not read left out, never as a made-up value.
type spoolCollector struct {
	spool                          spoolCounts
	logger                         *slog.Logger
	timeout                        time.Duration
	queue, outbox, oldest, success *prometheus.Desc
}

func newSpoolCollector(sp spoolCounts, logger *slog.Logger, timeout time.Duration) *spoolCollector {
	return &spoolCollector{
		spool:   sp,
		logger:  logger,
		timeout: timeout,
		queue:   prometheus.NewDesc(prometheus.BuildFQName(namespace, "queue", "depth"), "Jobs waiting in the queue.", nil, nil),
		outbox: prometheus.NewDesc(prometheus.BuildFQName(namespace, "outbox", "depth"),
			"Status reports not yet delivered to CubeMaster.", nil, nil),
		oldest: prometheus.NewDesc(prometheus.BuildFQName(namespace, "outbox", "oldest_report_age_seconds"),
			"Age of the oldest status report not yet delivered to CubeMaster; 0 when none waits.", nil, nil),
		success: prometheus.NewDesc(prometheus.BuildFQName(namespace, "spool", "scrape_success"),
			"Whether this scrape read the queue and outbox depths and the oldest report's age from the spool (1) or not (0).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *spoolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.queue
	ch <- c.outbox
	ch <- c.oldest
	ch <- c.success
}

// Collect implements prometheus.Collector.
func (c *spoolCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	var errs []error
	if queued, _, err := c.spool.Counts(ctx); err != nil {
		errs = append(errs, err)
	} else {
		ch <- prometheus.MustNewConstMetric(c.queue, prometheus.GaugeValue, float64(queued))
	}
	if n, err := c.spool.OutboxDepth(ctx); err != nil {
		errs = append(errs, err)
	} else {
		ch <- prometheus.MustNewConstMetric(c.outbox, prometheus.GaugeValue, float64(n))
	}
	if at, ok, err := c.spool.OldestReport(ctx); err != nil {
		errs = append(errs, err)
	} else {
		age := 0.0
		if ok {
			age = max(time.Since(at).Seconds(), 0)
		}
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, age)
	}
	success := 1.0
	if err := errors.Join(errs...); err != nil {
		c.logger.Warn("read metrics from spool", "err", err)
		success = 0
	}
	ch <- prometheus.MustNewConstMetric(c.success, prometheus.GaugeValue, success)
}

// The kind label of callback_attempts_total.
const (
	callbackProgress = "progress"
	callbackTerminal = "terminal"
)

// observeCallback counts one report delivery attempt.
func (m *metrics) observeCallback(outcome string, terminal bool) {
	kind := callbackProgress
	if terminal {
		kind = callbackTerminal
	}
	m.callbacks.WithLabelValues(outcome, kind).Inc()
}

// layerCache is what a Builder with a layer cache offers the metrics.
type layerCache interface {
	CacheStats() rootfs.CacheStats
}

// layerCacheCollector reads the layer cache's state once per scrape.
type layerCacheCollector struct {
	cache                            layerCache
	bytes, blobs, zstdBlobs, pending *prometheus.Desc
	transcoded, transcodeFailures    *prometheus.Desc
	// requests has a result label: hit or miss.
	requests *prometheus.Desc
}

func newLayerCacheCollector(c layerCache) *layerCacheCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "layer_cache", name), help, nil, nil)
	}
	return &layerCacheCollector{
		cache:             c,
		bytes:             d("bytes", "Bytes of layer blobs in the cache."),
		blobs:             d("blobs", "Layers in the cache."),
		zstdBlobs:         d("zstd_blobs", "Cached layers kept as zstd."),
		pending:           d("transcode_pending", "Cached layers queued for or being re-encoded as zstd."),
		transcoded:        d("transcoded_total", "Cached layers re-encoded as zstd."),
		transcodeFailures: d("transcode_failures_total", "Cached layers that could not be re-encoded and stay as served."),
		requests: prometheus.NewDesc(prometheus.BuildFQName(namespace, "layer_cache", "requests_total"),
			"Layers builds asked the cache for, by result: hit (served from the cache, not fetched) or miss (fetched from the registry, or from another build's fetch of it in flight).",
			[]string{"result"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *layerCacheCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.bytes, c.blobs, c.zstdBlobs, c.pending, c.transcoded, c.transcodeFailures, c.requests} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *layerCacheCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.cache.CacheStats()
	ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(c.blobs, prometheus.GaugeValue, float64(st.Blobs))
	ch <- prometheus.MustNewConstMetric(c.zstdBlobs, prometheus.GaugeValue, float64(st.ZstdBlobs))
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(st.TranscodePending))
	ch <- prometheus.MustNewConstMetric(c.transcoded, prometheus.CounterValue, float64(st.Transcoded))
	ch <- prometheus.MustNewConstMetric(c.transcodeFailures, prometheus.CounterValue, float64(st.TranscodeFailures))
	ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(st.Hits), "hit")
	ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(st.Misses), "miss")
}
