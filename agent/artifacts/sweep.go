package artifacts

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/masterdb"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// The CLEANUP_PENDING sweep. It deletes artifacts CubeMaster marked for
// deletion whose delete call failed or never came. It does not fail stale
// jobs: CubeMaster's own reconciler owns job state (TC only reports
// through callbacks), and two sweeps with thresholds kept in sync by hand
// would race over the same rows.
const (
	// cleanupAge is how long a row stays CLEANUP_PENDING, untouched,
	// before the sweep deletes it: long enough for CubeMaster's own delete
	// call to have run.
	cleanupAge = 5 * time.Minute
	// sweepLimit bounds the rows one sweep deletes.
	sweepLimit = 200
	// firstSweepAfter is how soon after start the first sweep runs (or one
	// interval, when that is shorter).
	firstSweepAfter = 15 * time.Second
)

// Sweep results, the result label of reconcile_sweeps_total.
const (
	sweepDone    = "done"
	sweepSkipped = "skipped"
	sweepFailed  = "failed"
)

// reconcileMetrics are the sweep's series.
type reconcileMetrics struct {
	sweeps  *prometheus.CounterVec
	deleted prometheus.Counter
	failed  prometheus.Counter
	orphans prometheus.Counter
	// orphansKept counts, at the last pass, the local copies without a row
	// that were kept, by why.
	orphansKept *prometheus.GaugeVec
}

func newReconcileMetrics() reconcileMetrics {
	m := reconcileMetrics{
		sweeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "reconcile", Name: "sweeps_total",
			Help: "CLEANUP_PENDING sweeps, by result (done; skipped: another replica held the lock; failed).",
		}, []string{"result"}),
		deleted: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: "reconcile", Name: "deleted_total",
			Help: "CLEANUP_PENDING artifacts the sweep deleted.",
		}),
		failed: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: "reconcile", Name: "delete_failures_total",
			Help: "CLEANUP_PENDING artifacts the sweep could not delete (left CLEANUP_PENDING with last_error).",
		}),
		orphans: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: "reconcile", Name: "local_removed_total",
			Help: "Local artifact copies removed because CubeMaster's database has no row for them.",
		}),
		orphansKept: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: "reconcile", Name: "local_orphans_kept",
			Help: "Local artifact copies without a row in CubeMaster's database that the last pass kept, by reason " +
				"(young: delivered less than replicas.orphan_age ago; unconfirmed: found without a row once so far).",
		}, []string{"reason"}),
	}
	for _, r := range []string{sweepDone, sweepSkipped, sweepFailed} {
		m.sweeps.WithLabelValues(r)
	}
	for _, r := range []string{orphanYoung, orphanUnconfirmed} {
		m.orphansKept.WithLabelValues(r)
	}
	return m
}

func (m reconcileMetrics) register(reg prometheus.Registerer) {
	reg.MustRegister(m.sweeps, m.deleted, m.failed, m.orphans, m.orphansKept)
}

// Reconcile sweeps (and removes orphaned local copies) soon after start, then every
// replicas.reconcile_interval, while the agent runs with a database. The
// settings are read at each pass, so a reload turns it on or off.
func (a *Artifacts) Reconcile(ctx context.Context) {
	if a.rows == nil {
		return
	}
	wait := min(firstSweepAfter, a.replicas().ReconcileInterval)
	for {
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		settings := a.replicas()
		wait = settings.ReconcileInterval
		if settings.ReconcileDisabled {
			continue
		}
		a.Sweep(ctx)
		a.removeOrphans(ctx)
	}
}

// Sweep deletes, under tc_reconcile_v1, up to sweepLimit artifacts whose
// rows have been CLEANUP_PENDING for cleanupAge, as a delete call would.
// When another replica holds the lock it sweeps, and this pass is skipped.
func (a *Artifacts) Sweep(ctx context.Context) {
	m := a.metrics.reconcile
	lock, ok, err := a.rows.TryLock(ctx, masterdb.ReconcileLockName, masterdb.LockOptions{Keepalive: a.replicas().LockKeepalive})
	switch {
	case err != nil:
		m.sweeps.WithLabelValues(sweepFailed).Inc()
		a.logger.Warn("reconcile: take the sweep lock", "err", err)
		return
	case !ok:
		m.sweeps.WithLabelValues(sweepSkipped).Inc()
		a.logger.Debug("reconcile: another replica is sweeping")
		return
	}
	defer func() {
		if err := lock.Release(context.WithoutCancel(ctx)); err != nil {
			a.logger.Warn("reconcile: release the sweep lock", "err", err)
		}
	}()
	ids, err := a.rows.StaleCleanups(ctx, cleanupAge, sweepLimit)
	if err != nil {
		m.sweeps.WithLabelValues(sweepFailed).Inc()
		a.logger.Warn("reconcile: list CLEANUP_PENDING artifacts", "err", err)
		return
	}
	deleted, failed := 0, 0
	for _, id := range ids {
		if ctx.Err() != nil {
			break
		}
		if !api.ValidArtifactID(id) {
			failed++
			m.failed.Inc()
			a.logger.Warn("reconcile: CLEANUP_PENDING row has an artifact id that is not a plain name; left alone", "artifact_id", id)
			continue
		}
		if err := a.deleteClaimed(ctx, a.logger.With("artifact_id", id), id); err != nil {
			failed++
			m.failed.Inc()
			a.logger.Warn("reconcile: delete CLEANUP_PENDING artifact", "artifact_id", id, "err", err)
			continue
		}
		deleted++
		m.deleted.Inc()
	}
	m.sweeps.WithLabelValues(sweepDone).Inc()
	if len(ids) > 0 {
		a.logger.Info("reconcile: swept CLEANUP_PENDING artifacts", "deleted", deleted, "failed", failed)
	}
}

// Why a local copy CubeMaster's database has no row for was kept, the
// reason label of reconcile_local_orphans.
const (
	orphanYoung       = "young"
	orphanUnconfirmed = "unconfirmed"
)

// orphanPageSize is how many local artifacts one query of the reconcile
// pass reads.
const orphanPageSize = 200

// removeOrphans removes this replica's local copies of artifacts that
// CubeMaster's database has no row for. Such copies are left by deletes
// another replica answered. A copy goes only when all of these hold:
//   - its last BUILT report reached CubeMaster at least replicas.orphan_age
//     ago: CubeMaster registers asynchronously, and replays a BUILT job
//     whose registration failed, so a young copy may still get its row;
//   - no job of this replica still needs it (unfinished, or a report not yet
//     delivered);
//   - two passes at least a reconcile interval apart found no row, so one
//     lagging or inconsistent read of the database removes nothing.
//
// Without a blob store the copy is the only one: these rules are what keep
// it. The blob store's object is not touched: deleting it is CubeMaster's
// call, and another replica may have reported it in a BUILT CubeMaster has
// not received yet. A database that cannot tell keeps everything.
func (a *Artifacts) removeOrphans(ctx context.Context) {
	now := time.Now()
	settings := a.replicas()
	seen := map[string]time.Time{}
	kept := map[string]int{orphanYoung: 0, orphanUnconfirmed: 0}
	defer func() {
		a.orphansSeen = seen
		for reason, n := range kept {
			a.metrics.reconcile.orphansKept.WithLabelValues(reason).Set(float64(n))
		}
	}()
	for after := ""; ctx.Err() == nil; {
		recs, err := a.index.DeliveredArtifacts(ctx, now, after, orphanPageSize)
		if err != nil {
			a.logger.Warn("reconcile: list local artifacts", "err", err)
			return
		}
		for _, rec := range recs {
			if ctx.Err() != nil {
				return
			}
			if _, err := a.rows.Artifact(ctx, rec.ID); !errors.Is(err, masterdb.ErrArtifactNotFound) {
				if err != nil {
					a.logger.Warn("reconcile: look up the row of a local artifact", "artifact_id", rec.ID, "err", err)
					if first, ok := a.orphansSeen[rec.ID]; ok {
						seen[rec.ID] = first // no answer is no evidence either way
					}
				}
				continue
			}
			first, ok := a.orphansSeen[rec.ID]
			if !ok {
				first = now
			}
			seen[rec.ID] = first
			switch {
			case now.Sub(rec.DeliveredAt) < settings.OrphanAge:
				kept[orphanYoung]++
				continue
			case now.Sub(first) < settings.ReconcileInterval:
				kept[orphanUnconfirmed]++
				continue
			}
			a.removeOrphan(ctx, rec)
			delete(seen, rec.ID)
		}
		if len(recs) < orphanPageSize {
			return
		}
		after = recs[len(recs)-1].ID
	}
}

// removeOrphan removes one local copy removeOrphans found orphaned, unless
// a job needs it by now.
func (a *Artifacts) removeOrphan(ctx context.Context, rec spool.Artifact) {
	rmErr := a.whenIdle(rec.ID, func() error {
		if err := a.unreported(ctx, rec.ID); err != nil {
			return err
		}
		return a.removeLocalCopy(ctx, rec.ID)
	})
	switch {
	case errors.Is(rmErr, ErrBuilding), errors.Is(rmErr, ErrReported):
	case rmErr != nil:
		a.logger.Warn("reconcile: remove orphaned local artifact", "artifact_id", rec.ID, "err", rmErr)
	default:
		a.metrics.reconcile.orphans.Inc()
		a.logger.Info("reconcile: removed local artifact CubeMaster has no row for", "artifact_id", rec.ID, "path", rec.Path,
			"delivered_at", rec.DeliveredAt)
	}
}
