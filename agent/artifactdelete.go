package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/cubesandbox/cubetemplatecenter/agent/masterdb"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
)

// errArtifactBuilding refuses a delete of an artifact being built or
// reused here, or by another replica (its build lock is held).
var errArtifactBuilding = errors.New("artifact is being built")

// errArtifactReported refuses a delete of an artifact a job of this
// replica is about to report or has reported BUILT without CubeMaster
// having received it yet: CubeMaster would register an artifact whose
// data is gone.
var errArtifactReported = errors.New("artifact is named in a job report CubeMaster has not received yet")

// deleteArtifact deletes artifact id's data and answers with the HTTP
// status and message of the outcome. Alone, it removes the object, then
// <store>/<id>/ (only when it holds nothing but the image), then the
// spool's record. With CubeMaster's database it follows the claim
// protocol (deleteClaimed).
func (a *Agent) deleteArtifact(ctx context.Context, id string) (int, string) {
	log := a.logger.With("artifact_id", id)
	if a.db != nil {
		return a.deleteClaimed(ctx, id)
	}
	ran, err := a.removeArtifactData(ctx, id, "")
	return a.deleteAnswer(log, ran, err)
}

// removeArtifactData deletes the blob store's object (by the artifact's
// key and any extraKeys) and its record first, so that when the store
// fails nothing local is gone and a retry finds the same state; then the
// local directory and the spool's record. ran is false when the artifact
// is being built: nothing is deleted.
func (a *Agent) removeArtifactData(ctx context.Context, id, rowKey string) (ran bool, err error) {
	ran = a.exec.withArtifactIdle(id, func() {
		if err = a.unreported(ctx, id); err != nil {
			return
		}
		if err = a.objects.remove(ctx, id, rowKey); err != nil {
			return
		}
		err = a.removeLocalCopy(ctx, id)
	})
	return ran, err
}

// unreported returns errArtifactReported while a job of this replica names
// artifact id and has a report CubeMaster has not received: a job that
// reuses the artifact names it (SetFingerprint) before its flight starts
// and until its BUILT report is delivered.
func (a *Agent) unreported(ctx context.Context, id string) error {
	pending, err := a.spool.ArtifactPending(ctx, id)
	switch {
	case err != nil:
		return err
	case pending:
		return errArtifactReported
	}
	return nil
}

// removeLocalCopy removes <store>/<id>/ and the spool's record of it.
func (a *Agent) removeLocalCopy(ctx context.Context, id string) error {
	if err := a.store.RemoveArtifact(id); err != nil {
		return err
	}
	return a.spool.DeleteArtifact(ctx, id)
}

// deleteAnswer turns the outcome of removeArtifactData into an answer.
func (a *Agent) deleteAnswer(log *slog.Logger, ran bool, err error) (int, string) {
	switch {
	case !ran:
		return http.StatusConflict, errArtifactBuilding.Error()
	case errors.Is(err, errArtifactReported):
		log.Warn("artifact delete refused", "err", err)
		return http.StatusConflict, err.Error() + "; retry once it is delivered"
	case errors.Is(err, rootfs.ErrNotArtifact):
		log.Warn("artifact delete refused", "err", err)
		return http.StatusConflict, err.Error() + "; left in place"
	case err != nil:
		log.Error("delete artifact", "err", err)
		return http.StatusInternalServerError, err.Error()
	}
	log.Info("artifact deleted")
	return http.StatusOK, ""
}

// deleteClaimed deletes an artifact CubeMaster marked for deletion: it
// claims the row (DELETING), deletes the object by the row's object_key
// and storage_backend as well as by the artifact's own key, then the local
// directory, then hard-deletes the row. A data step that fails puts the
// row back to CLEANUP_PENDING with last_error (500), for a retry or the
// sweep. No row at all means a replica deleted it already: whatever is
// left of it (object, record, local copy) is removed, idempotently. A row
// in another status (READY, BUILDING) is not CubeMaster's request to
// delete: 409, nothing touched.
func (a *Agent) deleteClaimed(ctx context.Context, id string) (int, string) {
	log := a.logger.With("artifact_id", id)
	row, claimed, err := a.db.ClaimArtifact(ctx, id)
	switch {
	case errors.Is(err, masterdb.ErrArtifactNotFound):
		ran, err := a.removeArtifactData(ctx, id, "")
		return a.deleteAnswer(log.With("row", "none"), ran, err)
	case errors.Is(err, masterdb.ErrUnavailable):
		log.Warn("artifact delete refused: CubeMaster's database is unavailable", "err", err)
		return http.StatusServiceUnavailable, "CubeMaster's database is unavailable; retry later"
	case err != nil:
		log.Error("claim artifact row", "err", err)
		return http.StatusInternalServerError, "claim artifact row: " + err.Error()
	case !claimed:
		log.Warn("artifact delete refused: its row is not marked for deletion", "status", row.Status)
		return http.StatusConflict, fmt.Sprintf("artifact is %s in CubeMaster's database, not CLEANUP_PENDING; nothing deleted", row.Status)
	}
	// The fingerprint's build lock keeps out builds and reuses of the
	// artifact on every replica while its data goes.
	if row.Fingerprint != "" {
		lock, ok, lerr := a.db.TryLock(ctx, masterdb.BuildLockName(row.Fingerprint), masterdb.LockOptions{Keepalive: a.config().Replicas.LockKeepalive})
		switch {
		case lerr != nil:
			a.releaseClaim(ctx, log, id, "take the build lock: "+lerr.Error())
			log.Warn("artifact delete refused: cannot take its build lock", "err", lerr)
			return http.StatusServiceUnavailable, "CubeMaster's database is unavailable; retry later"
		case !ok:
			a.releaseClaim(ctx, log, id, errArtifactBuilding.Error()+" by a replica")
			log.Warn("artifact delete refused: a replica is building or reusing it")
			return http.StatusConflict, errArtifactBuilding.Error() + " or reused by a replica; left in place"
		}
		defer func() {
			if err := lock.Release(context.WithoutCancel(ctx)); err != nil {
				log.Warn("release build lock after delete", "err", err)
			}
		}()
	}
	if row.StoreBacked() && (a.objects == nil || a.objects.store.Backend() != row.StorageBackend) {
		err = fmt.Errorf("artifact object %s is in a %s blob store, which this replica is not configured with", row.ObjectKey, row.StorageBackend)
	} else {
		var ran bool
		ran, err = a.removeArtifactData(ctx, id, row.ObjectKey)
		if err == nil && !ran {
			err = errArtifactBuilding
		}
	}
	if err != nil {
		log.Error("delete artifact data; row back to CLEANUP_PENDING", "err", err)
		a.releaseClaim(ctx, log, id, err.Error())
		if errors.Is(err, rootfs.ErrNotArtifact) || errors.Is(err, errArtifactBuilding) || errors.Is(err, errArtifactReported) {
			return http.StatusConflict, err.Error() + "; left in place"
		}
		return http.StatusInternalServerError, "delete artifact data: " + err.Error()
	}
	if err := a.db.DeleteClaimed(ctx, id); err != nil {
		log.Error("delete artifact row", "err", err)
		return http.StatusInternalServerError, "delete artifact row: " + err.Error()
	}
	log.Info("artifact deleted", "object_key", row.ObjectKey, "row", "deleted")
	return http.StatusOK, ""
}

// releaseClaim puts a claimed row back to CLEANUP_PENDING with lastError,
// for a retry or the sweep.
func (a *Agent) releaseClaim(ctx context.Context, log *slog.Logger, id, lastError string) {
	if err := a.db.ReleaseClaim(context.WithoutCancel(ctx), id, lastError); err != nil {
		log.Error("put artifact row back to CLEANUP_PENDING", "err", err)
	}
}
