package agent

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/cubesandbox/cubetemplatecenter/rootfs"
)

const namespace = "cube_templatecenter"

// metrics are the agent's Prometheus series, on a private registry.
type metrics struct {
	registry      *prometheus.Registry
	accepted      prometheus.Counter
	finished      *prometheus.CounterVec
	phaseDuration *prometheus.HistogramVec
	running       prometheus.Gauge
	callbacks     *prometheus.CounterVec
	dedup         *prometheus.CounterVec
	interrupted   prometheus.Counter
}

// spoolCounts is what the depth gauges read at scrape time.
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
			Help:    "Time spent in each build phase.",
			Buckets: []float64{0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800},
		}, []string{"phase"}),
		running: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: "builds", Name: "running",
			Help: "Builds running in this process.",
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
	}
	depth := func(name, help string, read func(ctx context.Context) (int, error)) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help}, func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			n, err := read(ctx)
			if err != nil {
				logger.Warn("read metric from spool", "metric", name, "err", err)
				return -1
			}
			return float64(n)
		})
	}
	m.registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.accepted, m.finished, m.phaseDuration, m.running, m.callbacks, m.dedup, m.interrupted,
		depth("queue_depth", "Jobs waiting in the queue.", func(ctx context.Context) (int, error) {
			q, _, err := sp.Counts(ctx)
			return q, err
		}),
		depth("outbox_depth", "Status reports not yet delivered to CubeMaster.", sp.OutboxDepth),
	)
	for _, r := range []string{"built", "failed"} {
		m.finished.WithLabelValues(r)
	}
	for _, k := range []string{"reuse", "inflight"} {
		m.dedup.WithLabelValues(k)
	}
	return m
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
}

func newLayerCacheCollector(c layerCache) *layerCacheCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "layer_cache", name), help, nil, nil)
	}
	return &layerCacheCollector{
		cache:             c,
		bytes:             d("bytes", "Bytes of layer blobs in the cache."),
		blobs:             d("blobs", "Layers in the cache."),
		zstdBlobs:         d("zstd_blobs", "Cached layers re-encoded as zstd."),
		pending:           d("transcode_pending", "Cached layers queued for or being re-encoded as zstd."),
		transcoded:        d("transcoded_total", "Cached layers re-encoded as zstd."),
		transcodeFailures: d("transcode_failures_total", "Cached layers that could not be re-encoded and stay as served."),
	}
}

// Describe implements prometheus.Collector.
func (c *layerCacheCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.bytes, c.blobs, c.zstdBlobs, c.pending, c.transcoded, c.transcodeFailures} {
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
}
