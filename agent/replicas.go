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
	"github.com/cubesandbox/cubetemplatecenter/agent/cmdb"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
)

// replicaDB is what builds need of CubeMaster's database to share work
// with other replicas: READY artifact rows and the build lock.
type replicaDB interface {
	ReadyArtifact(ctx context.Context, fingerprint string) (cmdb.ArtifactRow, error)
	TryLock(ctx context.Context, name string, o cmdb.LockOptions) (*cmdb.Lock, bool, error)
}

var _ replicaDB = (*cmdb.DB)(nil)

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
	return []prometheus.Collector{m.lockWaits, m.lockWaitSeconds, m.lockLosses, m.lockUnavailable, m.reuseHits}
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
		if !errors.Is(err, cmdb.ErrArtifactNotFound) {
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

// produce makes the artifact of a flight this replica leads. Alone, it
// builds. With other replicas it first takes the fingerprint's build lock,
// waiting (and watching for a READY row) while another replica holds it;
// under the lock it reuses what the last holder left (a READY row, or the
// object with its record, uploaded before CubeMaster registered it) and
// builds only when there is neither.
func (r *jobRun) produce(ctx context.Context, img *rootfs.Image, ca *rootfs.CA, fp, artifactID string) (*api.Built, error) {
	e := r.e
	if e.shared == nil {
		return r.buildArtifact(ctx, img, ca, fp, artifactID)
	}
	lock, built, err := r.buildLock(ctx, fp)
	switch {
	case err != nil:
		return nil, err
	case built != nil:
		return built, nil
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
	if built, ok := e.reuseFromRow(ctx, fp, r.log); ok {
		r.log.Info("artifact registered by another replica, reusing it", "artifact_id", built.ArtifactID)
		return built, nil
	}
	if built, ok := e.objects.adopt(ctx, artifactID, fp, r.log); ok {
		e.metrics.reuseHits.WithLabelValues(reuseObject).Inc()
		r.log.Info("artifact uploaded by another replica, reusing it", "object_key", built.ObjectKey)
		return built, nil
	}
	return r.buildArtifact(ctx, img, ca, fp, artifactID)
}

// buildLock takes fp's build lock, waiting while another replica holds it:
// every replicas.lock_poll_interval it looks for a READY row (returned as
// built when found) and tries the lock again, until ctx ends (build.timeout,
// every job cancelled, the agent stopping). When the database cannot be
// reached it returns neither lock nor artifact: the build goes on alone.
func (r *jobRun) buildLock(ctx context.Context, fp string) (*cmdb.Lock, *api.Built, error) {
	e := r.e
	name := cmdb.BuildLockName(fp)
	log := r.log.With("lock", name)
	opts := cmdb.LockOptions{
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
			if unavailable >= lockUnavailableTries || !cmdb.Unavailable(err) {
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
