// Package collect reads, at each scrape, the state of parts that keep no
// series of their own: the spool's queue and outbox, and the builder's
// layer cache. A failed read shows as a success series at 0, never as a
// made-up value. The series are named without a namespace: register the
// collectors with a prefixing Registerer.
package collect

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cubesandbox/cubetemplatecenter/rootfs"
)

// SpoolCounts is what the spool collector reads at scrape time;
// *spool.Spool is one.
type SpoolCounts interface {
	Counts(ctx context.Context) (queued, running int, err error)
	OutboxDepth(ctx context.Context) (int, error)
	OldestReport(ctx context.Context) (time.Time, bool, error)
}

// spoolCollector reads the spool's depths once per scrape. A failed read
// is logged once, here, and shows as spool_scrape_success 0 with the depth
// it could not read left out.
type spoolCollector struct {
	spool                          SpoolCounts
	logger                         *slog.Logger
	timeout                        time.Duration
	queue, outbox, oldest, success *prometheus.Desc
}

// Spool returns the collector of the spool's queue and outbox depths and
// its oldest report's age, each scrape's queries bounded by timeout.
func Spool(sp SpoolCounts, logger *slog.Logger, timeout time.Duration) prometheus.Collector {
	return &spoolCollector{
		spool:   sp,
		logger:  logger,
		timeout: timeout,
		queue:   prometheus.NewDesc("queue_depth", "Jobs waiting in the queue.", nil, nil),
		outbox:  prometheus.NewDesc("outbox_depth", "Status reports not yet delivered to CubeMaster.", nil, nil),
		oldest: prometheus.NewDesc("outbox_oldest_report_age_seconds",
			"Age of the oldest status report not yet delivered to CubeMaster; 0 when none waits.", nil, nil),
		success: prometheus.NewDesc("spool_scrape_success",
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

// LayerCache is what a Builder with a layer cache offers the metrics.
type LayerCache interface {
	CacheStats() rootfs.CacheStats
}

// layerCacheCollector reads the layer cache's state once per scrape.
type layerCacheCollector struct {
	cache                            LayerCache
	bytes, blobs, zstdBlobs, pending *prometheus.Desc
	transcoded, transcodeFailures    *prometheus.Desc
	// requests has a result label: hit or miss.
	requests *prometheus.Desc
}

// Layers returns the collector of the layer cache's size and counters.
func Layers(c LayerCache) prometheus.Collector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("", "layer_cache", name), help, nil, nil)
	}
	return &layerCacheCollector{
		cache:             c,
		bytes:             d("bytes", "Bytes of layer blobs in the cache."),
		blobs:             d("blobs", "Layers in the cache."),
		zstdBlobs:         d("zstd_blobs", "Cached layers kept as zstd."),
		pending:           d("transcode_pending", "Cached layers queued for or being re-encoded as zstd."),
		transcoded:        d("transcoded_total", "Cached layers re-encoded as zstd."),
		transcodeFailures: d("transcode_failures_total", "Cached layers that could not be re-encoded and stay as served."),
		requests: prometheus.NewDesc("layer_cache_requests_total",
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
