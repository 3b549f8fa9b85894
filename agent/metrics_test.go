package agent

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/agent/liveprogress"
	"github.com/cubesandbox/cubetemplatecenter/agent/masterdb"
	"github.com/cubesandbox/cubetemplatecenter/agent/tracing"
)

// TestMetricsLint lints the registry /metrics serves, as the agent builds
// it with every optional part (layer cache, blob store, live progress,
// database), each vector holding a series so that its name is linted too;
// no two series may share a help text.
func TestMetricsLint(t *testing.T) {
	m := fullMetrics(t)

	problems, err := testutil.GatherAndLint(m.registry)
	if err != nil {
		t.Fatalf("GatherAndLint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
	for _, c := range m.collectors {
		for _, d := range unseenDescs(c) {
			t.Errorf("%T describes %s but collects no series for it: give it one above, so that it is linted", c, d)
		}
	}
	mfs, err := m.registry.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	help := map[string]string{}
	for _, mf := range mfs {
		help[mf.GetName()] = mf.GetHelp()
	}
	if dups := sameHelp(help); len(dups) > 0 {
		t.Errorf("series share a help text: %v", dups)
	}
	// Each optional part registered its series.
	for _, name := range []string{"layer_cache_blobs", "blobstore_fallbacks_total", "redis_progress_writes_total",
		"replica_lock_waits_total", "reconcile_deleted_total", "trace_spans_dropped_total",
		"config_last_reload_successful", "config_last_reload_success_timestamp_seconds"} {
		if _, ok := help[namespace+"_"+name]; !ok {
			t.Errorf("the registry has no %s_%s", namespace, name)
		}
	}
	// Nothing reaches the registry but through register.
	got, err := testutil.GatherAndCount(m.registry)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, c := range m.collectors {
		want += testutil.CollectAndCount(c)
	}
	if got != want {
		t.Errorf("registry gathers %d series, the registered collectors %d", got, want)
	}
}

// fullMetrics returns the metrics of an agent with every optional part, the
// database and Redis unreachable (neither is needed to build the agent), and
// a series in each vector that starts empty.
func fullMetrics(t *testing.T) *metrics {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()

	ctx := context.Background()
	cfg := config.Default()
	cfg.Store.Dir = t.TempDir()
	sp := tempSpool(t)
	cfg.Spool.Path = sp.Path()
	cfg.InstanceDB = config.InstanceDB{Driver: config.DriverPostgres, Addr: closed, User: "u", DBName: "d", ConnTimeout: 1}
	cfg.Redis.Nodes = config.Nodes{closed}
	db, err := masterdb.Open(ctx, masterdb.Options{Driver: masterdb.DriverPostgres, Addr: closed, User: "u", DBName: "d",
		ConnTimeout: time.Second})
	if err != nil {
		t.Fatalf("open the database: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	live, err := liveprogress.New(liveprogress.Options{Nodes: []string{closed}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("open the Redis publisher: %v", err)
	}
	t.Cleanup(func() { live.Close(ctx) })
	objects, err := blobstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tp, err := tracing.Setup(ctx, tracing.Options{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.Shutdown(ctx) })
	a := New(Options{Config: cfg, Spool: sp, Builder: &testBuilder{}, Logger: slog.New(slog.DiscardHandler),
		BlobStore: objects, Database: db, LiveProgress: live, TracerProvider: tp})
	m := a.metrics
	a.health.Round(ctx)
	m.observeCallback("delivered", true)
	a.Handler().ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/livez", nil))
	return m
}

// unseenDescs returns the descriptors c describes and never collects.
func unseenDescs(c prometheus.Collector) []string {
	described := make(chan *prometheus.Desc)
	go func() { c.Describe(described); close(described) }()
	// By text: a wrapped collector (a component's, registered with the
	// namespace prefix) hands out new descriptors at each call.
	seen := map[string]bool{}
	for d := range described {
		seen[d.String()] = false
	}
	collected := make(chan prometheus.Metric)
	go func() { c.Collect(collected); close(collected) }()
	for m := range collected {
		seen[m.Desc().String()] = true
	}
	var out []string
	for d, ok := range seen {
		if !ok {
			out = append(out, d)
		}
	}
	return out
}

// sameHelp returns the help texts that more than one metric carries, each
// with the metrics' names in order; help maps a metric's name to its help.
func sameHelp(help map[string]string) map[string][]string {
	byHelp := map[string][]string{}
	for name, h := range help {
		byHelp[h] = append(byHelp[h], name)
	}
	for h, names := range byHelp {
		if len(names) < 2 {
			delete(byHelp, h)
			continue
		}
		slices.Sort(names)
	}
	return byHelp
}

func TestSameHelp(t *testing.T) {
	got := sameHelp(map[string]string{"c": "Things.", "b": "Other things.", "a_total": "Things."})
	want := map[string][]string{"Things.": {"a_total", "c"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("sameHelp = %v, want %v", got, want)
	}
}

// TestCallbackSeriesStartAtZero: every outcome and kind of
// callback_attempts_total is served at 0 before the first callback, as
// docs/observability.md promises of the counters.
func TestCallbackSeriesStartAtZero(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	m := scrape(t, h)
	for _, outcome := range []string{"delivered", "retry", "dropped"} {
		for _, kind := range []string{"progress", "terminal"} {
			want := `cube_templatecenter_callback_attempts_total{kind="` + kind + `",outcome="` + outcome + `"} 0`
			if !strings.Contains(m, want) {
				t.Errorf("metrics before any callback lack %s", want)
			}
		}
	}
}

// TestFailuresCountedByPhase: a job that fails counts under the phase its
// FAILED report names; the other phases are served at 0.
func TestFailuresCountedByPhase(t *testing.T) {
	h := newHarness(t, nil)
	h.builder.resolveErr = errors.New("manifest unknown")
	h.start()
	h.submit("fails-pulling", "img")
	if cb := h.terminal("fails-pulling"); cb.Field("status") != "FAILED" || cb.Field("phase") != "PULLING" {
		t.Fatalf("terminal report = %v, want FAILED at PULLING", cb.Body)
	}
	for phase, want := range map[string]float64{"PULLING": 1, "UNPACKING": 0, "BUILDING_EXT4": 0} {
		if got := h.metric("jobs_failed_total", "phase", phase); got != want {
			t.Errorf("jobs_failed_total{phase=%q} = %v, want %v", phase, got, want)
		}
	}
}
