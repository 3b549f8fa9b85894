package agent

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cubesandbox/cubetemplatecenter/agent/config"
)

// TestMetricsLint lints every collector the agent registers, with each
// vector holding a series so that its name is linted too.
func TestMetricsLint(t *testing.T) {
	cfg := config.Default()
	cfg.Store.Dir = t.TempDir()
	sp := tempSpool(t)
	a := New(Options{Config: cfg, Spool: sp, Builder: &testBuilder{}, Logger: slog.New(slog.DiscardHandler)})
	m := a.metrics
	m.phaseDuration.WithLabelValues("build").Observe(1)
	m.observeCallback("delivered", true)

	if len(m.collectors) == 0 {
		t.Fatal("the agent registered no collectors")
	}
	for _, c := range m.collectors {
		problems, err := testutil.CollectAndLint(c)
		if err != nil {
			t.Errorf("CollectAndLint(%T): %v", c, err)
		}
		for _, p := range problems {
			t.Errorf("metric %s: %s", p.Metric, p.Text)
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

// fakeSpoolCounts answers the spool collector's queries; nil funcs fail.
type fakeSpoolCounts struct {
	CountsFunc      func(ctx context.Context) (queued, running int, err error)
	OutboxDepthFunc func(ctx context.Context) (int, error)
}

var _ spoolCounts = (*fakeSpoolCounts)(nil)

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

func TestSpoolCollector(t *testing.T) {
	const (
		queueHelp = `# HELP cube_templatecenter_queue_depth Jobs waiting in the queue.
# TYPE cube_templatecenter_queue_depth gauge
`
		outboxHelp = `# HELP cube_templatecenter_outbox_depth Status reports not yet delivered to CubeMaster.
# TYPE cube_templatecenter_outbox_depth gauge
`
		successHelp = `# HELP cube_templatecenter_spool_scrape_success Whether this scrape read the queue and outbox depths from the spool (1) or not (0).
# TYPE cube_templatecenter_spool_scrape_success gauge
`
	)
	counts := func(context.Context) (int, int, error) { return 3, 1, nil }
	outbox := func(context.Context) (int, error) { return 2, nil }
	for _, c := range []struct {
		name  string
		spool *fakeSpoolCounts
		want  string
		warns int
	}{
		{"Success", &fakeSpoolCounts{CountsFunc: counts, OutboxDepthFunc: outbox},
			queueHelp + "cube_templatecenter_queue_depth 3\n" + outboxHelp + "cube_templatecenter_outbox_depth 2\n" +
				successHelp + "cube_templatecenter_spool_scrape_success 1\n", 0},
		{"SpoolFails", &fakeSpoolCounts{},
			successHelp + "cube_templatecenter_spool_scrape_success 0\n", 1},
		{"OutboxFails", &fakeSpoolCounts{CountsFunc: counts},
			queueHelp + "cube_templatecenter_queue_depth 3\n" + successHelp + "cube_templatecenter_spool_scrape_success 0\n", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			var logs syncBuffer
			col := newSpoolCollector(c.spool, slog.New(slog.NewTextHandler(&logs, nil)), time.Second)
			if err := testutil.CollectAndCompare(col, strings.NewReader(c.want)); err != nil {
				t.Error(err)
			}
			if n := strings.Count(logs.String(), "read metrics from spool"); n != c.warns {
				t.Errorf("scrape logged %d spool failures, want %d:\n%s", n, c.warns, logs.String())
			}
		})
	}
}
