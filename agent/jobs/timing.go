package jobs

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// jobTimings are the durations of a job's life outside its build phases:
// how long it waited in the queue, and how long CubeMaster waited for its
// result.
type jobTimings struct {
	queueWait  prometheus.Histogram
	turnaround *prometheus.HistogramVec
}

func newJobTimings() jobTimings {
	return jobTimings{
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Subsystem: "jobs", Name: "queue_wait_seconds",
			Help:    "Time from a job's acceptance to the start of its first run.",
			Buckets: []float64{0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600},
		}),
		turnaround: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: "jobs", Name: "turnaround_seconds",
			Help:    "Time from a job's acceptance to its terminal state, by result (built, failed).",
			Buckets: []float64{1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200},
		}, []string{"result"}),
	}
}

// observeQueueWait records the wait of a job's first run. A later run (the
// job resumed after a stop) is left out: its wait would count the earlier
// run too.
func (m jobTimings) observeQueueWait(job spool.Job) {
	if job.Attempts == 1 && !job.StartedAt.IsZero() && !job.CreatedAt.IsZero() {
		m.queueWait.Observe(job.StartedAt.Sub(job.CreatedAt).Seconds())
	}
}

// observeTurnaround records a job that reached state now, accepted at
// created.
func (m jobTimings) observeTurnaround(state spool.State, created time.Time) {
	if !created.IsZero() {
		m.turnaround.WithLabelValues(string(state)).Observe(time.Since(created).Seconds())
	}
}

// enterPhaseLocked times the API phases (api.Phase*) a job goes through:
// when phase differs from the one the job is in, the time spent in that one
// is observed in build_phase_duration_seconds. r.mu is held.
func (r *jobRun) enterPhaseLocked(phase string, now time.Time) {
	if phase == r.phase && !r.phaseSince.IsZero() {
		return
	}
	if !r.phaseSince.IsZero() {
		r.e.metrics.phaseDuration.WithLabelValues(r.phase).Observe(now.Sub(r.phaseSince).Seconds())
	}
	r.phaseSince = now
}

// observeEnd records the end of a job that reached state: its turnaround
// and, when it built, the last phase it was in. The phase a job failed or
// was stopped in is not observed, so the histogram holds the time phases
// take when they complete.
func (r *jobRun) observeEnd(state spool.State) {
	r.e.metrics.observeTurnaround(state, r.job.CreatedAt)
	if state != spool.StateBuilt {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.phaseSince.IsZero() {
		r.e.metrics.phaseDuration.WithLabelValues(r.phase).Observe(time.Since(r.phaseSince).Seconds())
		r.phaseSince = time.Time{}
	}
}
