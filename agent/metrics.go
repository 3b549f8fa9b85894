package agent

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/cubesandbox/cubetemplatecenter/rootfs"
)

const namespace = "cube_templatecenter"

// spoolScrapeTimeout bounds the spool queries of one scrape.
const spoolScrapeTimeout = 2 * time.Second

// metrics are the agent's Prometheus series, on a private registry.
// Subsystems: jobs (the life of build jobs), build (the image work),
// callback (reports to CubeMaster), queue and outbox (spool depths, with
// spool_scrape_success), layer_cache, blobstore and, with a database,
// replica and reconcile.
type metrics struct {
	registry *prometheus.Registry
	// collectors are all the registry holds, in registration order.
	collectors    []prometheus.Collector
	accepted      prometheus.Counter
	finished      *prometheus.CounterVec
	phaseDuration *prometheus.HistogramVec
	running       prometheus.Gauge
	callbacks     *prometheus.CounterVec
	dedup         *prometheus.CounterVec
	interrupted   prometheus.Counter
	cancelled     prometheus.Counter
	timedOut      prometheus.Counter
	// replica is registered only with a database (replica_* series).
	replica replicaMetrics
	// reconcile is registered only with a database, as replica.
	reconcile reconcileMetrics
}

// spoolCounts is what the spool collector reads at scrape time.
type spoolCounts interface {
	Counts(ctx context.Context) (queued, running int, err error)
	OutboxDepth(ctx context.Context) (int, error)
}

func newMetrics(sp spoolCounts, logger *slog.Logger) *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		accepted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "jobs", Name: "accepted_total",
			Help: "Build jobs accepted and committed to the spool.",
		}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "jobs", Name: "finished_total",
			Help: "Build jobs that reached a terminal state, by result (built, failed).",
		}, []string{"result"}),
		phaseDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "build", Name: "phase_duration_seconds",
			Help:    "Time a job spent in each phase its status reports name (PULLING: resolving the image; UNPACKING: CA, fingerprint, reuse checks and waiting for an identical build; BUILDING_EXT4: pulling layers, writing and publishing the image), for the phases it left and the last phase of a job that built.",
			Buckets: []float64{0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800},
		}, []string{"phase"}),
		running: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: "jobs", Name: "running",
			Help: "Build jobs running in this process.",
		}),
		callbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "callback", Name: "attempts_total",
			Help: "Status report deliveries to CubeMaster, by outcome (delivered, retry, dropped) and kind.",
		}, []string{"outcome", "kind"}),
		dedup: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "build", Name: "dedup_hits_total",
			Help: "Builds avoided: reuse of a published artifact, or joining an identical build in flight.",
		}, []string{"kind"}),
		interrupted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "jobs", Name: "interrupted_total",
			Help: "Builds interrupted by a stop and put back in the queue.",
		}),
		cancelled: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "jobs", Name: "cancelled_total",
			Help: "Jobs ended FAILED by a cancel request, queued or running.",
		}),
		timedOut: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "jobs", Name: "timed_out_total",
			Help: "Jobs ended FAILED because their build ran past build.timeout.",
		}),
		replica:   newReplicaMetrics(),
		reconcile: newReconcileMetrics(),
	}
	m.register(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.accepted, m.finished, m.phaseDuration, m.running, m.callbacks, m.dedup, m.interrupted, m.cancelled, m.timedOut,
		newSpoolCollector(sp, logger, spoolScrapeTimeout),
	)
	for _, r := range []string{"built", "failed"} {
		m.finished.WithLabelValues(r)
	}
	for _, k := range []string{"reuse", "inflight"} {
		m.dedup.WithLabelValues(k)
	}
	return m
}

// register adds collectors to the registry; it panics on a duplicate, as
// only a programming error causes one.
func (m *metrics) register(cs ...prometheus.Collector) {
	m.registry.MustRegister(cs...)
	m.collectors = append(m.collectors, cs...)
}

// spoolCollector reads the spool's depths once per scrape. A failed read
// is logged once, here, and shows as spool_scrape_success 0 with the depth
// it could not read left out, never as a made-up value.
type spoolCollector struct {
	spool                  spoolCounts
	logger                 *slog.Logger
	timeout                time.Duration
	queue, outbox, success *prometheus.Desc
}

func newSpoolCollector(sp spoolCounts, logger *slog.Logger, timeout time.Duration) *spoolCollector {
	return &spoolCollector{
		spool:   sp,
		logger:  logger,
		timeout: timeout,
		queue:   prometheus.NewDesc(prometheus.BuildFQName(namespace, "queue", "depth"), "Jobs waiting in the queue.", nil, nil),
		outbox: prometheus.NewDesc(prometheus.BuildFQName(namespace, "outbox", "depth"),
			"Status reports not yet delivered to CubeMaster.", nil, nil),
		success: prometheus.NewDesc(prometheus.BuildFQName(namespace, "spool", "scrape_success"),
			"Whether this scrape read the queue and outbox depths from the spool (1) or not (0).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *spoolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.queue
	ch <- c.outbox
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
	success := 1.0
	if err := errors.Join(errs...); err != nil {
		c.logger.Warn("read metrics from spool", "err", err)
		success = 0
	}
	ch <- prometheus.MustNewConstMetric(c.success, prometheus.GaugeValue, success)
}

// observeCallback counts one report delivery attempt.
func (m *metrics) observeCallback(outcome string, terminal bool) {
	kind := "progress"
	if terminal {
		kind = "terminal"
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
