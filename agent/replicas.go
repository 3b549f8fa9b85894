package agent

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
	"github.com/cubesandbox/cubetemplatecenter/agent/masterdb"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
)

// replicaDB is what builds need of CubeMaster's database to share work
// with other replicas: READY artifact rows and the build lock.
type replicaDB interface {
	ReadyArtifact(ctx context.Context, fingerprint string) (masterdb.ArtifactRow, error)
	TryLock(ctx context.Context, name string, o masterdb.LockOptions) (*masterdb.Lock, bool, error)
}

var _ replicaDB = (*masterdb.DB)(nil)

// Reuse sources, the source label of reuse_hits_total.
const (
	reuseRow    = "row"
	reuseObject = "object"
	reuseLocal  = "local"
)

// lockUnavailableTries is how many lock attempts in a row may find the
// database unreachable before a build goes on without the lock: the
// artifact is deterministic, so the cost is at worst a duplicate build,
// never a wrong one or a lost job.
const lockUnavailableTries = 3

// replicaMetrics are the series of the coordination with other replicas.
type replicaMetrics struct {
	lockWaits       prometheus.Counter
	lockWaitSeconds prometheus.Histogram
	lockLosses      prometheus.Counter
	lockUnavailable prometheus.Counter
	publishLockLost prometheus.Counter
	reuseHits       *prometheus.CounterVec
}

func newReplicaMetrics() replicaMetrics {
	m := replicaMetrics{
		lockWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "replica", Name: "lock_waits_total",
			Help: "Builds that found their fingerprint's lock held by another replica and waited.",
		}),
		lockWaitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "replica", Name: "lock_wait_seconds",
			Help:    "Time builds waited for another replica's build of the same fingerprint.",
			Buckets: []float64{1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600},
		}),
		lockLosses: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "replica", Name: "lock_losses_total",
			Help: "Build locks found lost while held (connection dropped or killed).",
		}),
		lockUnavailable: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "replica", Name: "lock_unavailable_total",
			Help: "Builds that went on without the build lock because the database could not be reached.",
		}),
		publishLockLost: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "replica", Name: "publish_lock_lost_total",
			Help: "Builds that found their build lock lost when about to publish the artifact, and waited for it.",
		}),
		reuseHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "replica", Name: "reuse_hits_total",
			Help: "Jobs answered with an existing artifact instead of a build, by where it was found.",
		}, []string{"source"}),
	}
	for _, s := range []string{reuseRow, reuseObject, reuseLocal} {
		m.reuseHits.WithLabelValues(s)
	}
	return m
}

func (m replicaMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.lockWaits, m.lockWaitSeconds, m.lockLosses, m.lockUnavailable, m.publishLockLost, m.reuseHits}
}

// reuseFromRow returns the READY artifact row's artifact for fp when its
// data passes the check: the object in the blob store for a store-backed
// row (found: reused; missing: not; an error falls through to the local
// check), else the local image file.
func (e *executor) reuseFromRow(ctx context.Context, fp string, log *slog.Logger) (*api.Built, bool) {
	if e.shared == nil {
		return nil, false
	}
	row, err := e.shared.ReadyArtifact(ctx, fp)
	if err != nil {
		if !errors.Is(err, masterdb.ErrArtifactNotFound) {
			log.Warn("look up READY artifact row", "err", err)
		}
		return nil, false
	}
	built := &api.Built{ArtifactID: row.ArtifactID, Fingerprint: row.Fingerprint, SourceDigest: row.SourceDigest,
		Ext4Path: row.Ext4Path, Ext4SHA256: row.Ext4SHA256, Ext4SizeBytes: row.Ext4SizeBytes,
		ImageConfigJSON: row.ImageConfigJSON, CABaked: row.CABaked, CAFingerprint: row.CAFingerprint,
		CATargets: row.CATargets, StorageBackend: row.StorageBackend, ObjectKey: row.ObjectKey, ArtifactURL: row.ArtifactURL}
	if row.StoreBacked() && e.objects != nil && e.objects.store.Backend() == row.StorageBackend {
		info, err := e.objects.store.Stat(ctx, row.ObjectKey)
		switch {
		case err == nil && info.Size == row.Ext4SizeBytes && (info.SHA256 == "" || info.SHA256 == row.Ext4SHA256):
			if out, err := e.objects.withFields(ctx, built, row.ObjectKey, log); err == nil && out.ObjectKey != "" {
				e.metrics.reuseHits.WithLabelValues(reuseRow).Inc()
				return out, true
			}
			return nil, false
		case err == nil:
			log.Warn("READY row's object differs from the row; not reusing it", "object_key", row.ObjectKey)
			return nil, false
		case errors.Is(err, blobstore.ErrNotFound):
			log.Warn("READY row's object is gone; not reusing it", "object_key", row.ObjectKey)
			return nil, false
		}
		log.Warn("check READY row's object; trying the local copy", "object_key", row.ObjectKey, "err", err)
	}
	fi, err := os.Stat(row.Ext4Path)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != row.Ext4SizeBytes {
		return nil, false
	}
	e.metrics.reuseHits.WithLabelValues(reuseRow).Inc()
	return built, true
}

// produce makes the artifact of a flight this replica leads; reused says
// it found one instead of building. Alone, it reuses the local artifact or
// builds. With other replicas it first takes the fingerprint's build lock,
// waiting (and watching for a READY row) while another replica holds it;
// under the lock it reuses what is there (a READY row, the local artifact,
// or the object with its record another replica uploaded before CubeMaster
// registered it) and builds only when there is nothing. The lock, held
// until the artifact is published, also keeps a delete of the artifact out
// (deleteClaimed takes it).
func (r *jobRun) produce(ctx context.Context, img *rootfs.Image, ca *rootfs.CA, fp, artifactID string) (built *api.Built, reused bool, err error) {
	e := r.e
	var lock *masterdb.Lock
	if e.shared != nil {
		lctx, endWait := lockWaitSpan(ctx)
		lock, built, err = r.buildLock(lctx, fp)
		endWait(built, err)
		switch {
		case err != nil:
			return nil, false, err
		case built != nil:
			return built, true, nil
		}
		if lock != nil {
			defer func() {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				defer cancel()
				if err := lock.Release(rctx); err != nil {
					r.log.Warn("release build lock", "lock", lock.Name(), "err", err)
				}
			}()
		}
		rctx, endReuse := reuseSpan(ctx, "row")
		built, ok := e.reuseFromRow(rctx, fp, r.log)
		endReuse(ok, nil)
		if ok {
			r.log.Info("reusing READY artifact", "artifact_id", built.ArtifactID, "object_key", built.ObjectKey)
			return built, true, nil
		}
	}
	rctx, endReuse := reuseSpan(ctx, "local")
	built, ok, err := r.reuseLocal(rctx, lock, fp, artifactID)
	if endReuse(ok, err); err != nil || ok {
		return built, ok, err
	}
	if e.shared != nil {
		rctx, endReuse := reuseSpan(ctx, "object")
		built, ok := r.adoptObject(rctx, artifactID, fp)
		if endReuse(ok, nil); ok {
			return built, true, nil
		}
	}
	r.setPhase(ctx, api.PhaseBuildingExt4, api.ProgressBuilding)
	if built, err = r.buildArtifact(ctx, img, ca, fp, artifactID); err != nil {
		return nil, false, err
	}
	built, reused, err = r.publishChecked(ctx, lock, fp, artifactID, built)
	return built, reused, err
}

// adoptObject returns the artifact another replica uploaded (with its
// signed record) before CubeMaster registered it, when there is one.
func (r *jobRun) adoptObject(ctx context.Context, artifactID, fp string) (*api.Built, bool) {
	built, ok := r.e.objects.adopt(ctx, artifactID, fp, r.log)
	if ok {
		r.e.metrics.reuseHits.WithLabelValues(reuseObject).Inc()
		r.log.Info("artifact uploaded by another replica, reusing it", "object_key", built.ObjectKey)
	}
	return built, ok
}

// reuseLocal returns the artifact this replica published for fp when it
// is still intact, with its object in the blob store (uploaded again when
// it is missing there). An artifact gone from both is forgotten: ok is
// false and it is built again.
func (r *jobRun) reuseLocal(ctx context.Context, lock *masterdb.Lock, fp, artifactID string) (*api.Built, bool, error) {
	e := r.e
	built, ok := e.reusable(ctx, fp, r.log)
	if !ok {
		return nil, false, nil
	}
	out, reused, err := r.publishChecked(ctx, lock, fp, artifactID, built)
	switch {
	case errors.Is(err, errObjectMissing):
		r.log.Warn("artifact gone from the blob store and the local store, rebuilding")
		if err := e.artifacts.DeleteArtifact(ctx, artifactID); err != nil {
			r.log.Warn("forget vanished artifact", "err", err)
		}
		return nil, false, nil
	case err != nil:
		return nil, false, err
	case reused:
		return out, true, nil // another replica's, while the lock was lost
	}
	e.metrics.reuseHits.WithLabelValues(reuseLocal).Inc()
	r.log.Info("reusing published artifact", "path", out.Ext4Path, "object_key", out.ObjectKey)
	return out, true, nil
}

// publishChecked puts built in the blob store (publishObject), first
// making sure the build lock, when there is one, is still held: when it was
// lost, another replica may be building and uploading the same artifact.
// It waits for the lock as buildLock does, and reports that replica's
// artifact (reused) when it registered or uploaded one meanwhile. The
// artifact is deterministic and an upload never aborts another replica's,
// so publishing without the lock (the database unreachable) is safe too:
// at worst the same bytes are uploaded twice.
func (r *jobRun) publishChecked(ctx context.Context, lock *masterdb.Lock, fp, artifactID string, built *api.Built) (*api.Built, bool, error) {
	e := r.e
	if lock == nil || e.objects == nil {
		out, err := r.publishObject(ctx, built)
		return out, false, err
	}
	err := lock.Check(ctx)
	if err != nil {
		e.metrics.publishLockLost.Inc()
		r.log.Warn("build lock lost before publishing; waiting for it", "lock", lock.Name(), "err", err)
	}
	for err != nil {
		if !errors.Is(err, masterdb.ErrLockHeld) {
			r.log.Warn("cannot check the build lock; publishing without it", "lock", lock.Name(), "err", err)
			break
		}
		if other, ok := e.reuseFromRow(ctx, fp, r.log); ok {
			return other, true, nil
		}
		select {
		case <-ctx.Done():
			return nil, false, errStopping
		case <-time.After(e.replicaSettings().LockPollInterval):
		}
		if err = lock.Check(ctx); err == nil {
			r.log.Info("build lock taken again before publishing", "lock", lock.Name())
			if other, ok := r.adoptObject(ctx, artifactID, fp); ok {
				return other, true, nil
			}
		}
	}
	out, err := r.publishObject(ctx, built)
	return out, false, err
}

// buildLock takes fp's build lock, waiting while another replica holds it:
// every replicas.lock_poll_interval it looks for a READY row (returned as
// built when found) and tries the lock again, until ctx ends (build.timeout,
// every job cancelled, the agent stopping). When the database cannot be
// reached it returns neither lock nor artifact: the build goes on alone.
func (r *jobRun) buildLock(ctx context.Context, fp string) (*masterdb.Lock, *api.Built, error) {
	e := r.e
	name := masterdb.BuildLockName(fp)
	log := r.log.With("lock", name)
	opts := masterdb.LockOptions{
		Keepalive: e.replicaSettings().LockKeepalive,
		OnLost: func(err error) {
			e.metrics.lockLosses.Inc()
			log.Error("build lock lost; another replica may build the same artifact meanwhile", "err", err)
		},
		OnRegained: func() { log.Info("build lock taken again") },
	}
	var waitStart time.Time
	unavailable := 0
	for {
		lock, ok, err := e.shared.TryLock(ctx, name, opts)
		switch {
		case err == nil && ok:
			if !waitStart.IsZero() {
				e.metrics.lockWaitSeconds.Observe(time.Since(waitStart).Seconds())
				log.Info("build lock taken after waiting", "waited", time.Since(waitStart).Round(time.Millisecond))
			}
			return lock, nil, nil
		case err == nil:
			unavailable = 0
			if waitStart.IsZero() {
				waitStart = time.Now()
				e.metrics.lockWaits.Inc()
				log.Info("another replica is building this artifact; waiting for it")
			}
		case ctx.Err() != nil:
			return nil, nil, errStopping
		default:
			unavailable++
			if unavailable >= lockUnavailableTries || !masterdb.Unavailable(err) {
				e.metrics.lockUnavailable.Inc()
				log.Warn("cannot take the build lock; building without it", "err", err)
				return nil, nil, nil
			}
			log.Warn("take build lock", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil, nil, errStopping
		case <-time.After(e.replicaSettings().LockPollInterval):
		}
		if built, ok := e.reuseFromRow(ctx, fp, r.log); ok {
			if !waitStart.IsZero() {
				e.metrics.lockWaitSeconds.Observe(time.Since(waitStart).Seconds())
			}
			log.Info("another replica's artifact is READY, reusing it", "artifact_id", built.ArtifactID)
			return nil, built, nil
		}
	}
}
