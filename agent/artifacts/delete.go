package artifacts

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/cubesandbox/cubetemplatecenter/agent/masterdb"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
)

// Delete deletes artifact id's data. Alone, it removes the object, then
// <store>/<id>/ (only when it holds nothing but the image), then the
// spool's record. With CubeMaster's database it follows the claim
// protocol (deleteClaimed). Refusals are ErrBuilding, ErrReported,
// ErrNotMarked, rootfs.ErrNotArtifact (nothing deleted) and
// ErrDatabaseUnavailable (retry later); any other error leaves the
// artifact to a retry.
func (a *Artifacts) Delete(ctx context.Context, id string) error {
	log := a.logger.With("artifact_id", id)
	if a.rows != nil {
		return a.deleteClaimed(ctx, log, id)
	}
	return a.logDelete(log, a.removeData(ctx, id, ""))
}

// removeData deletes the blob store's object (by the artifact's key, and
// rowKey when it is that same key) and its record first, so that when the
// store fails nothing local is gone and a retry finds the same state; then
// the local directory and the spool's record. An artifact in use is
// refused with ErrBuilding: nothing is deleted.
func (a *Artifacts) removeData(ctx context.Context, id, rowKey string) error {
	return a.whenIdle(id, func() error {
		if err := a.unreported(ctx, id); err != nil {
			return err
		}
		if err := a.publisher.remove(ctx, id, rowKey); err != nil {
			return err
		}
		return a.removeLocalCopy(ctx, id)
	})
}

// unreported returns ErrReported while a job of this replica names
// artifact id and has a report CubeMaster has not received: a job that
// reuses the artifact names it (SetFingerprint) before its flight starts
// and until its BUILT report is delivered.
func (a *Artifacts) unreported(ctx context.Context, id string) error {
	pending, err := a.index.ArtifactPending(ctx, id)
	switch {
	case err != nil:
		return err
	case pending:
		return fmt.Errorf("%w; retry once it is delivered", ErrReported)
	}
	return nil
}

// removeLocalCopy removes <store>/<id>/ and the spool's record of it.
func (a *Artifacts) removeLocalCopy(ctx context.Context, id string) error {
	if err := a.store.RemoveArtifact(id); err != nil {
		return err
	}
	return a.index.DeleteArtifact(ctx, id)
}

// Refused reports whether err is a refusal of Delete that leaves the
// artifact as it was, for the caller to answer 409.
func Refused(err error) bool {
	return errors.Is(err, ErrBuilding) || errors.Is(err, ErrReported) || errors.Is(err, ErrNotMarked) ||
		errors.Is(err, rootfs.ErrNotArtifact)
}

// logDelete logs the outcome of a delete and returns err, with "left in
// place" added to a refusal of data that is not an artifact's.
func (a *Artifacts) logDelete(log *slog.Logger, err error) error {
	switch {
	case errors.Is(err, rootfs.ErrNotArtifact):
		err = fmt.Errorf("%w; left in place", err)
		log.Warn("artifact delete refused", "err", err)
	case errors.Is(err, ErrReported):
		log.Warn("artifact delete refused", "err", err)
	case errors.Is(err, ErrBuilding):
	case err != nil:
		log.Error("delete artifact", "err", err)
	default:
		log.Info("artifact deleted")
	}
	return err
}

// deleteClaimed deletes an artifact CubeMaster marked for deletion: it
// claims the row (DELETING), deletes the object by the row's object_key
// and storage_backend as well as by the artifact's own key, then the local
// directory, then hard-deletes the row. A data step that fails puts the
// row back to CLEANUP_PENDING with last_error, for a retry or the sweep.
// No row at all means a replica deleted it already: whatever is left of it
// (object, record, local copy) is removed, idempotently. A row in another
// status (READY, BUILDING) is not CubeMaster's request to delete:
// ErrNotMarked, nothing touched.
func (a *Artifacts) deleteClaimed(ctx context.Context, log *slog.Logger, id string) error {
	row, claimed, err := a.rows.ClaimArtifact(ctx, id)
	switch {
	case errors.Is(err, masterdb.ErrArtifactNotFound):
		return a.logDelete(log.With("row", "none"), a.removeData(ctx, id, ""))
	case errors.Is(err, masterdb.ErrUnavailable):
		log.Warn("artifact delete refused: CubeMaster's database is unavailable", "err", err)
		return fmt.Errorf("%w: %w", ErrDatabaseUnavailable, err)
	case err != nil:
		log.Error("claim artifact row", "err", err)
		return fmt.Errorf("claim artifact row: %w", err)
	case !claimed:
		log.Warn("artifact delete refused: its row is not marked for deletion", "status", row.Status)
		return fmt.Errorf("%w: it is %s, not CLEANUP_PENDING; nothing deleted", ErrNotMarked, row.Status)
	}
	// The fingerprint's build lock keeps out builds and reuses of the
	// artifact on every replica while its data goes.
	if row.Fingerprint != "" {
		lock, ok, lerr := a.rows.TryLock(ctx, masterdb.BuildLockName(row.Fingerprint), masterdb.LockOptions{Keepalive: a.replicas().LockKeepalive})
		switch {
		case lerr != nil:
			a.releaseClaim(ctx, log, id, "take the build lock: "+lerr.Error())
			log.Warn("artifact delete refused: cannot take its build lock", "err", lerr)
			return fmt.Errorf("%w: take the build lock: %w", ErrDatabaseUnavailable, lerr)
		case !ok:
			a.releaseClaim(ctx, log, id, ErrBuilding.Error()+" by a replica")
			log.Warn("artifact delete refused: a replica is building or reusing it")
			return fmt.Errorf("%w or reused by a replica; left in place", ErrBuilding)
		}
		defer func() {
			if err := lock.Release(context.WithoutCancel(ctx)); err != nil {
				log.Warn("release build lock after delete", "err", err)
			}
		}()
	}
	if row.StoreBacked() && (a.publisher == nil || a.publisher.blobs.Backend() != row.StorageBackend) {
		err = fmt.Errorf("artifact object %s is in a %s blob store, which this replica is not configured with", row.ObjectKey, row.StorageBackend)
	} else {
		err = a.removeData(ctx, id, row.ObjectKey)
	}
	if err != nil {
		log.Error("delete artifact data; row back to CLEANUP_PENDING", "err", err)
		a.releaseClaim(ctx, log, id, err.Error())
		if Refused(err) {
			return fmt.Errorf("%w; left in place", err)
		}
		return fmt.Errorf("delete artifact data: %w", err)
	}
	if err := a.rows.DeleteClaimed(ctx, id); err != nil {
		log.Error("delete artifact row", "err", err)
		return fmt.Errorf("delete artifact row: %w", err)
	}
	log.Info("artifact deleted", "object_key", row.ObjectKey, "row", "deleted")
	return nil
}

// releaseClaim puts a claimed row back to CLEANUP_PENDING with lastError,
// for a retry or the sweep.
func (a *Artifacts) releaseClaim(ctx context.Context, log *slog.Logger, id, lastError string) {
	if err := a.rows.ReleaseClaim(context.WithoutCancel(ctx), id, lastError); err != nil {
		log.Error("put artifact row back to CLEANUP_PENDING", "err", err)
	}
}
