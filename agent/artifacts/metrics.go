package artifacts

import "github.com/prometheus/client_golang/prometheus"

// metrics are the series of the artifacts: the blob store's (registered
// with one) and, with CubeMaster's database, reuses, the build locks and
// the sweeps.
type metrics struct {
	objects   objectMetrics
	reconcile reconcileMetrics
	reuseHits *prometheus.CounterVec

	lockWaits       prometheus.Counter
	lockWaitSeconds prometheus.Histogram
	lockLosses      prometheus.Counter
	lockUnavailable prometheus.Counter
	publishLockLost prometheus.Counter
}

func newMetrics() metrics {
	m := metrics{
		objects:   newObjectMetrics(),
		reconcile: newReconcileMetrics(),
		reuseHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "replica", Name: "reuse_hits_total",
			Help: "Jobs answered with an existing artifact instead of a build, by where it was found.",
		}, []string{"source"}),
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
	for _, s := range []Source{SourceRow, SourceObject, SourceLocal} {
		m.reuseHits.WithLabelValues(string(s))
	}
	return m
}

// register registers the series that only a replica with a database
// updates.
func (m metrics) register(reg prometheus.Registerer) {
	reg.MustRegister(m.reuseHits, m.lockWaits, m.lockWaitSeconds, m.lockLosses, m.lockUnavailable, m.publishLockLost)
	m.reconcile.register(reg)
}
