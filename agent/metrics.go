package agent

import (
	"log/slog"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/cubesandbox/cubetemplatecenter/agent/collect"
	"github.com/cubesandbox/cubetemplatecenter/agent/report"
)

const namespace = "cube_templatecenter"

// spoolScrapeTimeout bounds the spool queries of one scrape.
const spoolScrapeTimeout = 2 * time.Second

// metrics are the daemon's Prometheus series, on a private registry.
// Subsystems: jobs (the life of build jobs), build (the image work),
// callback (reports to CubeMaster), queue and outbox (spool depths, with
// spool_scrape_success), layer_cache, blobstore and, with a database,
// replica and reconcile, http, volume, health. The packages that keep
// them (jobs, artifacts, httpobs, space, collect, health) register theirs
// through scoped.
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

func newMetrics(sp collect.SpoolCounts, logger *slog.Logger) *metrics {
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
	)
	m.scoped().MustRegister(collect.Spool(sp, logger, spoolScrapeTimeout))
	return m
}

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
		Name: "build_info",
		Help: "Always 1; the labels name the running version, the VCS revision it was built from and the Go release.",
	}, []string{"version", "revision", "goversion"})
	g.WithLabelValues(b.Version, b.Revision, runtime.Version()).Set(1)
	return g
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
