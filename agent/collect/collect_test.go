package collect

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cubesandbox/cubetemplatecenter/rootfs"
)

// registered is a registry holding c as the agent registers it: under
// its namespace.
func registered(c prometheus.Collector) *prometheus.Registry {
	reg := prometheus.NewPedanticRegistry()
	prometheus.WrapRegistererWithPrefix("cube_templatecenter_", reg).MustRegister(c)
	return reg
}

// fakeSpoolCounts answers the spool collector's queries; nil funcs fail.
type fakeSpoolCounts struct {
	CountsFunc      func(ctx context.Context) (queued, running int, err error)
	OutboxDepthFunc func(ctx context.Context) (int, error)
	OldestFunc      func(ctx context.Context) (time.Time, bool, error)
}

var _ SpoolCounts = (*fakeSpoolCounts)(nil)

func (f *fakeSpoolCounts) Counts(ctx context.Context) (int, int, error) {
	if f.CountsFunc == nil {
		return 0, 0, errors.New("count jobs: database is locked")
	}
	return f.CountsFunc(ctx)
}

func (f *fakeSpoolCounts) OutboxDepth(ctx context.Context) (int, error) {
	if f.OutboxDepthFunc == nil {
		return 0, errors.New("count outbox: database is locked")
	}
	return f.OutboxDepthFunc(ctx)
}

func (f *fakeSpoolCounts) OldestReport(ctx context.Context) (time.Time, bool, error) {
	if f.OldestFunc == nil {
		return time.Time{}, false, errors.New("read the outbox's oldest report: database is locked")
	}
	return f.OldestFunc(ctx)
}

func TestSpoolCollector(t *testing.T) {
	const (
		queueHelp = `# HELP cube_templatecenter_queue_depth Jobs waiting in the queue.
# TYPE cube_templatecenter_queue_depth gauge
`
		outboxHelp = `# HELP cube_templatecenter_outbox_depth Status reports not yet delivered to CubeMaster.
# TYPE cube_templatecenter_outbox_depth gauge
`
		oldestHelp = `# HELP cube_templatecenter_outbox_oldest_report_age_seconds Age of the oldest status report not yet delivered to CubeMaster; 0 when none waits.
# TYPE cube_templatecenter_outbox_oldest_report_age_seconds gauge
`
		successHelp = `# HELP cube_templatecenter_spool_scrape_success Whether this scrape read the queue and outbox depths and the oldest report's age from the spool (1) or not (0).
# TYPE cube_templatecenter_spool_scrape_success gauge
`
	)
	counts := func(context.Context) (int, int, error) { return 3, 1, nil }
	outbox := func(context.Context) (int, error) { return 2, nil }
	// Queued an hour ago: the age is a whole number of seconds give or
	// take the test's run, so compare it rounded.
	oldest := func(context.Context) (time.Time, bool, error) { return time.Now().Add(-time.Hour), true, nil }
	none := func(context.Context) (time.Time, bool, error) { return time.Time{}, false, nil }
	for _, c := range []struct {
		name  string
		spool *fakeSpoolCounts
		want  string
		warns int
	}{
		{"Success", &fakeSpoolCounts{CountsFunc: counts, OutboxDepthFunc: outbox, OldestFunc: none},
			queueHelp + "cube_templatecenter_queue_depth 3\n" + outboxHelp + "cube_templatecenter_outbox_depth 2\n" +
				oldestHelp + "cube_templatecenter_outbox_oldest_report_age_seconds 0\n" +
				successHelp + "cube_templatecenter_spool_scrape_success 1\n", 0},
		{"SpoolFails", &fakeSpoolCounts{},
			successHelp + "cube_templatecenter_spool_scrape_success 0\n", 1},
		{"OutboxFails", &fakeSpoolCounts{CountsFunc: counts, OldestFunc: none},
			queueHelp + "cube_templatecenter_queue_depth 3\n" + oldestHelp + "cube_templatecenter_outbox_oldest_report_age_seconds 0\n" +
				successHelp + "cube_templatecenter_spool_scrape_success 0\n", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			var logs bytes.Buffer
			reg := registered(Spool(c.spool, slog.New(slog.NewTextHandler(&logs, nil)), time.Second))
			if err := testutil.GatherAndCompare(reg, strings.NewReader(c.want)); err != nil {
				t.Error(err)
			}
			if n := strings.Count(logs.String(), "read metrics from spool"); n != c.warns {
				t.Errorf("scrape logged %d spool failures, want %d:\n%s", n, c.warns, logs.String())
			}
		})
	}
	t.Run("OldestReportAge", func(t *testing.T) {
		reg := registered(Spool(&fakeSpoolCounts{CountsFunc: counts, OutboxDepthFunc: outbox, OldestFunc: oldest},
			slog.New(slog.DiscardHandler), time.Second))
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "cube_templatecenter_outbox_oldest_report_age_seconds" {
				if age := mf.GetMetric()[0].GetGauge().GetValue(); age < 3600 || age > 3660 {
					t.Errorf("oldest report age = %v s for a report queued an hour ago", age)
				}
				return
			}
		}
		t.Error("no cube_templatecenter_outbox_oldest_report_age_seconds")
	})
}

// fakeCache reports fixed statistics.
type fakeCache rootfs.CacheStats

func (f fakeCache) CacheStats() rootfs.CacheStats { return rootfs.CacheStats(f) }

// TestLayerCacheCollector: each field of the cache's statistics is its
// series, hits and misses one counter by result.
func TestLayerCacheCollector(t *testing.T) {
	c := fakeCache{Bytes: 1 << 20, Blobs: 4, ZstdBlobs: 3, TranscodePending: 1, Transcoded: 5, TranscodeFailures: 2, Hits: 7, Misses: 9}
	want := `
# HELP cube_templatecenter_layer_cache_blobs Layers in the cache.
# TYPE cube_templatecenter_layer_cache_blobs gauge
cube_templatecenter_layer_cache_blobs 4
# HELP cube_templatecenter_layer_cache_bytes Bytes of layer blobs in the cache.
# TYPE cube_templatecenter_layer_cache_bytes gauge
cube_templatecenter_layer_cache_bytes 1.048576e+06
# HELP cube_templatecenter_layer_cache_requests_total Layers builds asked the cache for, by result: hit (served from the cache, not fetched) or miss (fetched from the registry, or from another build's fetch of it in flight).
# TYPE cube_templatecenter_layer_cache_requests_total counter
cube_templatecenter_layer_cache_requests_total{result="hit"} 7
cube_templatecenter_layer_cache_requests_total{result="miss"} 9
# HELP cube_templatecenter_layer_cache_transcode_failures_total Cached layers that could not be re-encoded and stay as served.
# TYPE cube_templatecenter_layer_cache_transcode_failures_total counter
cube_templatecenter_layer_cache_transcode_failures_total 2
# HELP cube_templatecenter_layer_cache_transcode_pending Cached layers queued for or being re-encoded as zstd.
# TYPE cube_templatecenter_layer_cache_transcode_pending gauge
cube_templatecenter_layer_cache_transcode_pending 1
# HELP cube_templatecenter_layer_cache_transcoded_total Cached layers re-encoded as zstd.
# TYPE cube_templatecenter_layer_cache_transcoded_total counter
cube_templatecenter_layer_cache_transcoded_total 5
# HELP cube_templatecenter_layer_cache_zstd_blobs Cached layers kept as zstd.
# TYPE cube_templatecenter_layer_cache_zstd_blobs gauge
cube_templatecenter_layer_cache_zstd_blobs 3
`
	if err := testutil.GatherAndCompare(registered(Layers(c)), strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
