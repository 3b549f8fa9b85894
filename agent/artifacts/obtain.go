package artifacts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/masterdb"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// Source says where Obtain found the artifact it returned; the first three
// are the source label of replica_reuse_hits_total.
type Source string

// Sources of an artifact.
const (
	// SourceRow is a READY row in CubeMaster's database.
	SourceRow Source = "row"
	// SourceLocal is the artifact this replica recorded.
	SourceLocal Source = "local"
	// SourceObject is an object another replica uploaded with its signed
	// record.
	SourceObject Source = "object"
	// SourceBuilt is a new build.
	SourceBuilt Source = "built"
)

// Request asks Obtain for the artifact of one fingerprint.
type Request struct {
	Fingerprint string
	ArtifactID  string
	// Image and CA are what a build records with the artifact.
	Image *rootfs.Image
	CA    *rootfs.CA
	// Build builds and publishes the image in the local store when
	// nothing can be reused.
	Build func(ctx context.Context) (*rootfs.Artifact, error)
	// Publishing, when set, is called before an upload to the blob store
	// begins; Progress receives the share uploaded (0..1).
	Publishing func(ctx context.Context)
	Progress   func(share float64)
	// Log is the job's logger.
	Log *slog.Logger
}

// lockUnavailableTries is how many lock attempts in a row may find the
// database unreachable before a build goes on without the lock: the
// artifact is deterministic, so the cost is at worst a duplicate build,
// never a wrong one or a lost job.
const lockUnavailableTries = 3

// Obtain returns the artifact of req's fingerprint and where it came from.
// Alone, it reuses the local artifact or builds. With other replicas it
// first takes the fingerprint's build lock, waiting (and watching for a
// READY row) while another replica holds it; under the lock it reuses what
// is there (a READY row, the local artifact, or the object with its record
// another replica uploaded before CubeMaster registered it) and builds
// only when there is nothing. What it builds, or reuses from the local
// store, it publishes to the blob store. The lock, held until the artifact
// is published, also keeps a delete of the artifact out (deleteClaimed
// takes it). The errors of req.Build and of the publication come back as
// they are; an ended ctx ends the wait for the lock.
func (a *Artifacts) Obtain(ctx context.Context, req Request) (*api.Built, Source, error) {
	log := req.Log
	if log == nil {
		log = a.logger
	}
	var lock *masterdb.Lock
	if a.rows != nil {
		lctx, endWait := lockWaitSpan(ctx)
		var built *api.Built
		var err error
		lock, built, err = a.buildLock(lctx, req.Fingerprint, log)
		endWait(built, err)
		switch {
		case err != nil:
			return nil, "", err
		case built != nil:
			return built, SourceRow, nil
		}
		if lock != nil {
			defer func() {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				defer cancel()
				if err := lock.Release(rctx); err != nil {
					log.Warn("release build lock", "lock", lock.Name(), "err", err)
				}
			}()
		}
		rctx, endReuse := reuseSpan(ctx, SourceRow)
		built, ok := a.fromRow(rctx, req.Fingerprint, log)
		endReuse(ok, nil)
		if ok {
			log.Info("reusing READY artifact", "artifact_id", built.ArtifactID, "object_key", built.ObjectKey)
			return built, SourceRow, nil
		}
	}
	rctx, endReuse := reuseSpan(ctx, SourceLocal)
	built, src, err := a.reuseLocal(rctx, req, lock, log)
	if endReuse(src != "", err); err != nil || src != "" {
		return built, src, err
	}
	if a.rows != nil {
		rctx, endReuse := reuseSpan(ctx, SourceObject)
		built, ok := a.adoptObject(rctx, req.ArtifactID, req.Fingerprint, log)
		if endReuse(ok, nil); ok {
			return built, SourceObject, nil
		}
	}
	art, err := req.Build(ctx)
	if err != nil {
		return nil, "", err
	}
	rec, built, err := a.record(context.WithoutCancel(ctx), req.Image, req.CA, req.Fingerprint, art)
	if err != nil {
		return nil, "", err
	}
	return a.publishChecked(ctx, req, lock, rec, built, log)
}

// publishChecked publishes built (publishTraced), first making sure the
// build lock, when there is one, is still held: when it was lost, another
// replica may be building and uploading the same artifact. It waits for
// the lock as buildLock does, and returns that replica's artifact, with
// where it was found, when it registered or uploaded one meanwhile;
// SourceBuilt otherwise. The artifact is deterministic and an upload never
// aborts another replica's, so publishing without the lock (the database
// unreachable) is safe too: at worst the same bytes are uploaded twice.
func (a *Artifacts) publishChecked(ctx context.Context, req Request, lock *masterdb.Lock, rec spool.Artifact, built *api.Built, log *slog.Logger) (*api.Built, Source, error) {
	if lock == nil || a.publisher == nil {
		out, err := a.publishTraced(ctx, req, rec, built)
		return out, SourceBuilt, err
	}
	err := lock.Check(ctx)
	if err != nil {
		a.metrics.publishLockLost.Inc()
		log.Warn("build lock lost before publishing; waiting for it", "lock", lock.Name(), "err", err)
	}
	for err != nil {
		if !errors.Is(err, masterdb.ErrLockHeld) {
			log.Warn("cannot check the build lock; publishing without it", "lock", lock.Name(), "err", err)
			break
		}
		if other, ok := a.fromRow(ctx, req.Fingerprint, log); ok {
			return other, SourceRow, nil
		}
		select {
		case <-ctx.Done():
			return nil, "", fmt.Errorf("wait for the build lock: %w", ctx.Err())
		case <-time.After(a.replicas().LockPollInterval):
		}
		if err = lock.Check(ctx); err == nil {
			log.Info("build lock taken again before publishing", "lock", lock.Name())
			if other, ok := a.adoptObject(ctx, req.ArtifactID, req.Fingerprint, log); ok {
				return other, SourceObject, nil
			}
		}
	}
	out, err := a.publishTraced(ctx, req, rec, built)
	return out, SourceBuilt, err
}

// publishTraced publishes built under its span, telling req first.
func (a *Artifacts) publishTraced(ctx context.Context, req Request, rec spool.Artifact, built *api.Built) (*api.Built, error) {
	if a.publisher == nil {
		return built, nil
	}
	if req.Publishing != nil {
		req.Publishing(ctx)
	}
	pctx, endPublish := publishSpan(ctx)
	out, err := a.publish(pctx, rec, built, req.Progress)
	endPublish(out, err)
	return out, err
}

// buildLock takes fp's build lock, waiting while another replica holds it:
// every replicas.lock_poll_interval it looks for a READY row (returned as
// built when found) and tries the lock again, until ctx ends (build.timeout,
// every job cancelled, the agent stopping). When the database cannot be
// reached it returns neither lock nor artifact: the build goes on alone.
func (a *Artifacts) buildLock(ctx context.Context, fp string, jobLog *slog.Logger) (*masterdb.Lock, *api.Built, error) {
	name := masterdb.BuildLockName(fp)
	log := jobLog.With("lock", name)
	opts := masterdb.LockOptions{
		Keepalive: a.replicas().LockKeepalive,
		OnLost: func(err error) {
			a.metrics.lockLosses.Inc()
			log.Error("build lock lost; another replica may build the same artifact meanwhile", "err", err)
		},
		OnRegained: func() { log.Info("build lock taken again") },
	}
	var waitStart time.Time
	unavailable := 0
	for {
		lock, ok, err := a.rows.TryLock(ctx, name, opts)
		switch {
		case err == nil && ok:
			if !waitStart.IsZero() {
				a.metrics.lockWaitSeconds.Observe(time.Since(waitStart).Seconds())
				log.Info("build lock taken after waiting", "waited", time.Since(waitStart).Round(time.Millisecond))
			}
			return lock, nil, nil
		case err == nil:
			unavailable = 0
			if waitStart.IsZero() {
				waitStart = time.Now()
				a.metrics.lockWaits.Inc()
				log.Info("another replica is building this artifact; waiting for it")
			}
		case ctx.Err() != nil:
			return nil, nil, fmt.Errorf("take the build lock: %w", ctx.Err())
		default:
			unavailable++
			if unavailable >= lockUnavailableTries || !masterdb.Unavailable(err) {
				a.metrics.lockUnavailable.Inc()
				log.Warn("cannot take the build lock; building without it", "err", err)
				return nil, nil, nil
			}
			log.Warn("take build lock", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("wait for the build lock: %w", ctx.Err())
		case <-time.After(a.replicas().LockPollInterval):
		}
		if built, ok := a.fromRow(ctx, fp, jobLog); ok {
			if !waitStart.IsZero() {
				a.metrics.lockWaitSeconds.Observe(time.Since(waitStart).Seconds())
			}
			log.Info("another replica's artifact is READY, reusing it", "artifact_id", built.ArtifactID)
			return nil, built, nil
		}
	}
}
