package artifacts

import "github.com/prometheus/client_golang/prometheus"

// metrics are the series of the artifacts: the blob store's (registered
// with one) and, with CubeMaster's database, reuses and the sweeps.
type metrics struct {
	objects   objectMetrics
	reconcile reconcileMetrics
	reuseHits *prometheus.CounterVec
}

func newMetrics() metrics {
	m := metrics{
		objects:   newObjectMetrics(),
		reconcile: newReconcileMetrics(),
		reuseHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "replica", Name: "reuse_hits_total",
			Help: "Jobs answered with an existing artifact instead of a build, by where it was found.",
		}, []string{"source"}),
	}
	for _, s := range []string{reuseRow, reuseObject, reuseLocal} {
		m.reuseHits.WithLabelValues(s)
	}
	return m
}

// register registers the series that only a replica with a database
// updates.
func (m metrics) register(reg prometheus.Registerer) {
	reg.MustRegister(m.reuseHits)
	m.reconcile.register(reg)
}
