package jobs

import (
	"context"
	"errors"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/masterdb"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
)

// lockUnavailableTries is how many lock attempts in a row may find the
// database unreachable before a build goes on without the lock: the
// artifact is deterministic, so the cost is at worst a duplicate build,
// never a wrong one or a lost job.
const lockUnavailableTries = 3

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
	if e.locks != nil {
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
		built, ok := e.artifacts.FromRow(rctx, fp, r.log)
		endReuse(ok, nil)
		if ok {
			r.log.Info("reusing READY artifact", "artifact_id", built.ArtifactID, "object_key", built.ObjectKey)
			return built, true, nil
		}
	}
	publish := func(ctx context.Context, built *api.Built) (*api.Built, bool, error) {
		return r.publishChecked(ctx, lock, fp, artifactID, built)
	}
	rctx, endReuse := reuseSpan(ctx, "local")
	built, ok, err := e.artifacts.ReuseLocal(rctx, fp, r.log, publish)
	if endReuse(ok, err); err != nil || ok {
		return built, ok, err
	}
	if e.locks != nil {
		rctx, endReuse := reuseSpan(ctx, "object")
		built, ok := e.artifacts.Adopt(rctx, artifactID, fp, r.log)
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
	if lock == nil || e.artifacts.Objects() == nil {
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
		if other, ok := e.artifacts.FromRow(ctx, fp, r.log); ok {
			return other, true, nil
		}
		select {
		case <-ctx.Done():
			return nil, false, errStopping
		case <-time.After(e.replicas().LockPollInterval):
		}
		if err = lock.Check(ctx); err == nil {
			r.log.Info("build lock taken again before publishing", "lock", lock.Name())
			if other, ok := e.artifacts.Adopt(ctx, artifactID, fp, r.log); ok {
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
		Keepalive: e.replicas().LockKeepalive,
		OnLost: func(err error) {
			e.metrics.lockLosses.Inc()
			log.Error("build lock lost; another replica may build the same artifact meanwhile", "err", err)
		},
		OnRegained: func() { log.Info("build lock taken again") },
	}
	var waitStart time.Time
	unavailable := 0
	for {
		lock, ok, err := e.locks.TryLock(ctx, name, opts)
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
		case <-time.After(e.replicas().LockPollInterval):
		}
		if built, ok := e.artifacts.FromRow(ctx, fp, r.log); ok {
			if !waitStart.IsZero() {
				e.metrics.lockWaitSeconds.Observe(time.Since(waitStart).Seconds())
			}
			log.Info("another replica's artifact is READY, reusing it", "artifact_id", built.ArtifactID)
			return nil, built, nil
		}
	}
}
