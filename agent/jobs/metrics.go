package jobs

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// metrics are the series of the executor: jobs and their phases, and,
// with CubeMaster's database, the coordination with other replicas.
type metrics struct {
	running       prometheus.Gauge
	phaseDuration *prometheus.HistogramVec
	dedup         *prometheus.CounterVec
	finished      *prometheus.CounterVec
	failed        *prometheus.CounterVec
	interrupted   prometheus.Counter
	cancelled     prometheus.Counter
	timedOut      prometheus.Counter
	startChecks   *prometheus.CounterVec

	lockWaits       prometheus.Counter
	lockWaitSeconds prometheus.Histogram
	lockLosses      prometheus.Counter
	lockUnavailable prometheus.Counter
	publishLockLost prometheus.Counter

	jobTimings
}

func newMetrics() metrics {
	m := metrics{
		jobTimings: newJobTimings(),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "jobs", Name: "finished_total",
			Help: "Build jobs that reached a terminal state, by result (built, failed).",
		}, []string{"result"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "jobs", Name: "failed_total",
			Help: "Build jobs that ended FAILED, by the phase their FAILED report names (PULLING, UNPACKING, BUILDING_EXT4).",
		}, []string{"phase"}),
		phaseDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: "build", Name: "phase_duration_seconds",
			Help:    "Time a job spent in each phase its status reports name (PULLING: resolving the image; UNPACKING: CA, fingerprint, reuse checks and waiting for an identical build; BUILDING_EXT4: pulling layers, writing and publishing the image), for the phases it left and the last phase of a job that built.",
			Buckets: []float64{0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800},
		}, []string{"phase"}),
		running: prometheus.NewGauge(prometheus.GaugeOpts{
			Subsystem: "jobs", Name: "running",
			Help: "Build jobs running in this process.",
		}),
		dedup: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "build", Name: "dedup_hits_total",
			Help: "Builds avoided: reuse of a published artifact, or joining an identical build in flight.",
		}, []string{"kind"}),
		interrupted: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: "jobs", Name: "interrupted_total",
			Help: "Builds interrupted by a stop and put back in the queue.",
		}),
		cancelled: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: "jobs", Name: "cancelled_total",
			Help: "Jobs ended FAILED by a cancel request, queued or running.",
		}),
		timedOut: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: "jobs", Name: "timed_out_total",
			Help: "Jobs ended FAILED because their build ran past build.timeout.",
		}),
		startChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "build", Name: "start_checks_total",
			Help: "Start checks of built images (build.start_check), by result (ok, warnings, no_command, failed); a failed one ends the job FAILED unless the check only warns.",
		}, []string{"result"}),
		lockWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: "replica", Name: "lock_waits_total",
			Help: "Builds that found their fingerprint's lock held by another replica and waited.",
		}),
		lockWaitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Subsystem: "replica", Name: "lock_wait_seconds",
			Help:    "Time builds waited for another replica's build of the same fingerprint.",
			Buckets: []float64{1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600},
		}),
		lockLosses: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: "replica", Name: "lock_losses_total",
			Help: "Build locks found lost while held (connection dropped or killed).",
		}),
		lockUnavailable: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: "replica", Name: "lock_unavailable_total",
			Help: "Builds that went on without the build lock because the database could not be reached.",
		}),
		publishLockLost: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: "replica", Name: "publish_lock_lost_total",
			Help: "Builds that found their build lock lost when about to publish the artifact, and waited for it.",
		}),
	}
	for _, r := range []string{"built", "failed"} {
		m.finished.WithLabelValues(r)
	}
	for _, p := range []string{api.PhasePulling, api.PhaseUnpacking, api.PhaseBuildingExt4} {
		m.failed.WithLabelValues(p)
	}
	for _, r := range startCheckResults {
		m.startChecks.WithLabelValues(r)
	}
	for _, k := range []string{"reuse", "inflight"} {
		m.dedup.WithLabelValues(k)
	}
	for _, p := range []string{api.PhasePulling, api.PhaseUnpacking, api.PhaseBuildingExt4} {
		m.phaseDuration.WithLabelValues(p)
	}
	for _, r := range []string{"built", "failed"} {
		m.turnaround.WithLabelValues(r)
	}
	return m
}

// register registers the job series, and the replica series when builds
// are shared with other replicas.
func (m metrics) register(reg prometheus.Registerer, replicas bool) {
	reg.MustRegister(m.running, m.phaseDuration, m.dedup, m.finished, m.failed, m.interrupted, m.cancelled, m.timedOut,
		m.startChecks, m.queueWait, m.turnaround)
	if replicas {
		reg.MustRegister(m.lockWaits, m.lockWaitSeconds, m.lockLosses, m.lockUnavailable, m.publishLockLost)
	}
}

// observeFinished counts a job that ended in state; a failed one by the
// phase its FAILED report names.
func (m metrics) observeFinished(state spool.State, phase string) {
	m.finished.WithLabelValues(string(state)).Inc()
	if state == spool.StateFailed {
		m.failed.WithLabelValues(phase).Inc()
	}
}
