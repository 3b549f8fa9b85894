package artifacts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
	"github.com/cubesandbox/cubetemplatecenter/agent/masterdb"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// record records the artifact a build just published in the local store,
// so that a later job with the same fingerprint reuses it, and returns the
// record and the artifact as the BUILT fields report it.
func (a *Artifacts) record(ctx context.Context, img *rootfs.Image, ca *rootfs.CA, fp string, art *rootfs.Artifact) (spool.Artifact, *api.Built, error) {
	cfgJSON, err := json.Marshal(img.Config)
	if err != nil {
		return spool.Artifact{}, nil, fmt.Errorf("encode image config: %w", err)
	}
	built := &api.Built{
		ArtifactID: art.ID, Fingerprint: fp, SourceDigest: img.Digest,
		Ext4Path: art.Path, Ext4SHA256: art.SHA256, Ext4SizeBytes: art.Size,
		ImageConfigJSON: string(cfgJSON), CABaked: art.CABaked, CATargets: art.CATargets,
	}
	if ca != nil {
		built.CAFingerprint = ca.Fingerprint
	}
	// Recorded with the artifact, so a reuse reports it too.
	built.TemplateCheck = templateCheck(art.StartCheck)
	result, err := json.Marshal(built)
	if err != nil {
		return spool.Artifact{}, nil, fmt.Errorf("encode artifact record: %w", err)
	}
	rec := spool.Artifact{ID: art.ID, Fingerprint: fp, Path: art.Path,
		SHA256: art.SHA256, Size: art.Size, ModTime: art.ModTime, Result: result}
	if err := a.index.PutArtifact(ctx, rec); err != nil {
		return spool.Artifact{}, nil, fmt.Errorf("record artifact: %w", err)
	}
	return rec, built, nil
}

// templateCheck is the start check's result as a BUILT report carries
// it, within the bounds that keep its JSON under
// safetext.TemplateCheckMax; nil stays nil.
func templateCheck(c *rootfs.StartCheck) *api.TemplateCheck {
	if c == nil {
		return nil
	}
	b := c.Bounded()
	return &api.TemplateCheck{Result: b.Result, Command: b.Command, Resolved: b.Resolved,
		Interpreter: b.Interpreter, Problems: b.Problems, Libraries: b.Libraries, LibrariesOmitted: b.LibrariesOmitted}
}

// boundCheck bounds a template_check read back from a record, which an
// earlier release (or another replica running one) may have written
// unbounded.
func boundCheck(c *api.TemplateCheck) *api.TemplateCheck {
	if c == nil {
		return nil
	}
	return templateCheck(&rootfs.StartCheck{Result: c.Result, Command: c.Command, Resolved: c.Resolved,
		Interpreter: c.Interpreter, Problems: c.Problems, Libraries: c.Libraries, LibrariesOmitted: c.LibrariesOmitted})
}

// publish puts built's artifact in the blob store, when there is one, and
// rewrites its record rec with the blob fields, so a reuse after a restart
// reports them too. progress receives the share uploaded (0..1). An
// artifact with neither an intact object nor a local image fails with
// ErrObjectMissing.
func (a *Artifacts) publish(ctx context.Context, rec spool.Artifact, built *api.Built, progress func(float64)) (*api.Built, error) {
	if a.publisher == nil {
		return built, nil
	}
	out, err := a.publisher.ensure(ctx, built, progress)
	if err != nil {
		return nil, err
	}
	if out.ObjectKey == built.ObjectKey && out.StorageBackend == built.StorageBackend {
		return out, nil
	}
	if rec.Result, err = json.Marshal(out); err != nil {
		return nil, fmt.Errorf("encode artifact record: %w", err)
	}
	if err := a.index.PutArtifact(context.WithoutCancel(ctx), rec); err != nil {
		return nil, fmt.Errorf("record blob fields of %s: %w", built.ArtifactID, err)
	}
	return out, nil
}

// recorded returns the record and the artifact this replica recorded for fp
// when its file
// is still the one published: same size and modification time, or failing
// that the same SHA-256. A record whose file changed or vanished is
// forgotten.
func (a *Artifacts) recorded(ctx context.Context, fp string, log *slog.Logger) (spool.Artifact, *api.Built, bool) {
	rec, err := a.index.ArtifactByFingerprint(ctx, fp)
	if err != nil {
		if !errors.Is(err, spool.ErrNotFound) {
			log.Warn("look up published artifact", "err", err)
		}
		return spool.Artifact{}, nil, false
	}
	var built api.Built
	if err := json.Unmarshal(rec.Result, &built); err != nil {
		log.Warn("recorded artifact is unreadable, rebuilding", "err", err)
		return spool.Artifact{}, nil, false
	}
	built.TemplateCheck = boundCheck(built.TemplateCheck)
	fi, err := os.Stat(rec.Path)
	if err == nil && fi.Mode().IsRegular() && fi.Size() == rec.Size && fi.ModTime().Equal(rec.ModTime) {
		return rec, &built, true
	}
	if errors.Is(err, os.ErrNotExist) && a.publisher != nil && built.ObjectKey != "" {
		// The local copy was dropped after a verified upload
		// (artifact_store.keep_local off): the object alone stands for
		// the artifact, checked by Publish.
		return rec, &built, true
	}
	if err == nil && fi.Mode().IsRegular() && fi.Size() == rec.Size {
		if sum, herr := rootfs.FileSHA256(ctx, rec.Path); herr == nil && sum == rec.SHA256 {
			rec.ModTime = fi.ModTime()
			if err := a.index.PutArtifact(ctx, rec); err != nil {
				log.Warn("refresh artifact record", "err", err)
			}
			return rec, &built, true
		}
	}
	log.Warn("published artifact changed or vanished, rebuilding", "path", rec.Path)
	if err := a.index.DeleteArtifact(ctx, rec.ID); err != nil {
		log.Warn("forget stale artifact", "err", err)
	}
	return spool.Artifact{}, nil, false
}

// reuseLocal returns the artifact this replica published for fp when it
// is still intact, with its object in the blob store (published again,
// under lock, when it is missing there); src is local, or where the
// artifact another replica registered or uploaded meanwhile was found. An
// artifact gone from both is forgotten: src is empty and it must be built
// again.
func (a *Artifacts) reuseLocal(ctx context.Context, req Request, lock *masterdb.Lock, log *slog.Logger) (*api.Built, Source, error) {
	rec, built, ok := a.recorded(ctx, req.Fingerprint, log)
	if !ok {
		return nil, "", nil
	}
	out, src, err := a.publishChecked(ctx, req, lock, rec, built, log)
	switch {
	case errors.Is(err, ErrObjectMissing):
		log.Warn("artifact gone from the blob store and the local store, rebuilding")
		if err := a.index.DeleteArtifact(ctx, built.ArtifactID); err != nil {
			log.Warn("forget vanished artifact", "err", err)
		}
		return nil, "", nil
	case err != nil:
		return nil, "", err
	case src != SourceBuilt:
		return out, src, nil // another replica's, while the lock was lost
	}
	a.metrics.reuseHits.WithLabelValues(string(SourceLocal)).Inc()
	log.Info("reusing published artifact", "path", out.Ext4Path, "object_key", out.ObjectKey)
	return out, SourceLocal, nil
}

// fromRow returns the artifact of fp's READY row in CubeMaster's database
// when its data passes the check: the object in the blob store for a
// store-backed row (found: reused; missing: not; an error falls through to
// the local check), else the local image file.
func (a *Artifacts) fromRow(ctx context.Context, fp string, log *slog.Logger) (*api.Built, bool) {
	if a.rows == nil {
		return nil, false
	}
	row, err := a.rows.ReadyArtifact(ctx, fp)
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
	if row.StoreBacked() && a.publisher != nil && a.publisher.blobs.Backend() == row.StorageBackend {
		info, err := a.publisher.blobs.Stat(ctx, row.ObjectKey)
		switch {
		case err == nil && info.Size == row.Ext4SizeBytes && (info.SHA256 == "" || info.SHA256 == row.Ext4SHA256):
			if out, err := a.publisher.withFields(ctx, built, row.ObjectKey, log); err == nil && out.ObjectKey != "" {
				a.metrics.reuseHits.WithLabelValues(string(SourceRow)).Inc()
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
	a.metrics.reuseHits.WithLabelValues(string(SourceRow)).Inc()
	return built, true
}

// adoptObject returns the artifact another replica uploaded (with its
// signed record) before CubeMaster registered it, when there is one.
func (a *Artifacts) adoptObject(ctx context.Context, artifactID, fp string, log *slog.Logger) (*api.Built, bool) {
	built, ok := a.publisher.adopt(ctx, artifactID, fp, log)
	if ok {
		a.metrics.reuseHits.WithLabelValues(string(SourceObject)).Inc()
		log.Info("artifact uploaded by another replica, reusing it", "object_key", built.ObjectKey)
	}
	return built, ok
}
