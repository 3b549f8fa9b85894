package jobs

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// metrics are the series of the executor: jobs and their phases.
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

// register registers the job series.
func (m metrics) register(reg prometheus.Registerer) {
	reg.MustRegister(m.running, m.phaseDuration, m.dedup, m.finished, m.failed, m.interrupted, m.cancelled, m.timedOut,
		m.startChecks, m.queueWait, m.turnaround)
}

// observeFinished counts a job that ended in state; a failed one by the
// phase its FAILED report names.
func (m metrics) observeFinished(state spool.State, phase string) {
	m.finished.WithLabelValues(string(state)).Inc()
	if state == spool.StateFailed {
		m.failed.WithLabelValues(phase).Inc()
	}
}
