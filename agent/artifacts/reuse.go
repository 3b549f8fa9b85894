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

// Where a reused artifact was found, the source label of
// replica_reuse_hits_total.
const (
	reuseRow    = "row"
	reuseObject = "object"
	reuseLocal  = "local"
)

// Record records the artifact a build just published in the local store,
// so that a later job with the same fingerprint reuses it, and returns it
// as the BUILT fields report it.
func (a *Artifacts) Record(ctx context.Context, img *rootfs.Image, ca *rootfs.CA, fp string, art *rootfs.Artifact) (*api.Built, error) {
	cfgJSON, err := json.Marshal(img.Config)
	if err != nil {
		return nil, fmt.Errorf("encode image config: %w", err)
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
	record, err := json.Marshal(built)
	if err != nil {
		return nil, fmt.Errorf("encode artifact record: %w", err)
	}
	if err := a.index.PutArtifact(ctx, spool.Artifact{ID: art.ID, Fingerprint: fp, Path: art.Path,
		SHA256: art.SHA256, Size: art.Size, ModTime: art.ModTime, Result: record}); err != nil {
		return nil, fmt.Errorf("record artifact: %w", err)
	}
	return built, nil
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

// Publish puts built's artifact in the blob store, when there is one, and
// records its blob fields with it, so a reuse after a restart reports them
// too. progress receives the share uploaded (0..1). An artifact with
// neither an intact object nor a local image fails with ErrObjectMissing.
func (a *Artifacts) Publish(ctx context.Context, built *api.Built, progress func(float64)) (*api.Built, error) {
	if a.objects == nil {
		return built, nil
	}
	out, err := a.objects.ensure(ctx, built, progress)
	if err != nil {
		return nil, err
	}
	if out.ObjectKey != built.ObjectKey || out.StorageBackend != built.StorageBackend {
		if err := a.recordBlobFields(context.WithoutCancel(ctx), out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// recordBlobFields stores built, with its blob fields, as the artifact's
// record.
func (a *Artifacts) recordBlobFields(ctx context.Context, built *api.Built) error {
	rec, err := a.index.ArtifactByFingerprint(ctx, built.Fingerprint)
	if err != nil {
		return fmt.Errorf("record blob fields of %s: %w", built.ArtifactID, err)
	}
	if rec.Result, err = json.Marshal(built); err != nil {
		return fmt.Errorf("encode artifact record: %w", err)
	}
	if err := a.index.PutArtifact(ctx, rec); err != nil {
		return fmt.Errorf("record blob fields of %s: %w", built.ArtifactID, err)
	}
	return nil
}

// recorded returns the artifact this replica recorded for fp when its file
// is still the one published: same size and modification time, or failing
// that the same SHA-256. A record whose file changed or vanished is
// forgotten.
func (a *Artifacts) recorded(ctx context.Context, fp string, log *slog.Logger) (*api.Built, bool) {
	rec, err := a.index.ArtifactByFingerprint(ctx, fp)
	if err != nil {
		if !errors.Is(err, spool.ErrNotFound) {
			log.Warn("look up published artifact", "err", err)
		}
		return nil, false
	}
	var built api.Built
	if err := json.Unmarshal(rec.Result, &built); err != nil {
		log.Warn("recorded artifact is unreadable, rebuilding", "err", err)
		return nil, false
	}
	built.TemplateCheck = boundCheck(built.TemplateCheck)
	fi, err := os.Stat(rec.Path)
	if err == nil && fi.Mode().IsRegular() && fi.Size() == rec.Size && fi.ModTime().Equal(rec.ModTime) {
		return &built, true
	}
	if errors.Is(err, os.ErrNotExist) && a.objects != nil && built.ObjectKey != "" {
		// The local copy was dropped after a verified upload
		// (artifact_store.keep_local off): the object alone stands for
		// the artifact, checked by Publish.
		return &built, true
	}
	if err == nil && fi.Mode().IsRegular() && fi.Size() == rec.Size {
		if sum, herr := rootfs.FileSHA256(ctx, rec.Path); herr == nil && sum == rec.SHA256 {
			rec.ModTime = fi.ModTime()
			if err := a.index.PutArtifact(ctx, rec); err != nil {
				log.Warn("refresh artifact record", "err", err)
			}
			return &built, true
		}
	}
	log.Warn("published artifact changed or vanished, rebuilding", "path", rec.Path)
	if err := a.index.DeleteArtifact(ctx, rec.ID); err != nil {
		log.Warn("forget stale artifact", "err", err)
	}
	return nil, false
}

// PublishFunc puts a reused artifact in the blob store as a build's
// publication does; other says it returned another replica's artifact
// instead.
type PublishFunc func(ctx context.Context, built *api.Built) (out *api.Built, other bool, err error)

// ReuseLocal returns the artifact this replica published for fp when it
// is still intact, with its object in the blob store (publish uploads it
// again when it is missing there). An artifact gone from both is
// forgotten: ok is false and it must be built again.
func (a *Artifacts) ReuseLocal(ctx context.Context, fp string, log *slog.Logger, publish PublishFunc) (*api.Built, bool, error) {
	built, ok := a.recorded(ctx, fp, log)
	if !ok {
		return nil, false, nil
	}
	out, other, err := publish(ctx, built)
	switch {
	case errors.Is(err, ErrObjectMissing):
		log.Warn("artifact gone from the blob store and the local store, rebuilding")
		if err := a.index.DeleteArtifact(ctx, built.ArtifactID); err != nil {
			log.Warn("forget vanished artifact", "err", err)
		}
		return nil, false, nil
	case err != nil:
		return nil, false, err
	case other:
		return out, true, nil // another replica's, while the lock was lost
	}
	a.metrics.reuseHits.WithLabelValues(reuseLocal).Inc()
	log.Info("reusing published artifact", "path", out.Ext4Path, "object_key", out.ObjectKey)
	return out, true, nil
}

// FromRow returns the artifact of fp's READY row in CubeMaster's database
// when its data passes the check: the object in the blob store for a
// store-backed row (found: reused; missing: not; an error falls through to
// the local check), else the local image file.
func (a *Artifacts) FromRow(ctx context.Context, fp string, log *slog.Logger) (*api.Built, bool) {
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
	if row.StoreBacked() && a.objects != nil && a.objects.store.Backend() == row.StorageBackend {
		info, err := a.objects.store.Stat(ctx, row.ObjectKey)
		switch {
		case err == nil && info.Size == row.Ext4SizeBytes && (info.SHA256 == "" || info.SHA256 == row.Ext4SHA256):
			if out, err := a.objects.withFields(ctx, built, row.ObjectKey, log); err == nil && out.ObjectKey != "" {
				a.metrics.reuseHits.WithLabelValues(reuseRow).Inc()
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
	a.metrics.reuseHits.WithLabelValues(reuseRow).Inc()
	return built, true
}

// Adopt returns the artifact another replica uploaded (with its signed
// record) before CubeMaster registered it, when there is one.
func (a *Artifacts) Adopt(ctx context.Context, artifactID, fp string, log *slog.Logger) (*api.Built, bool) {
	built, ok := a.objects.adopt(ctx, artifactID, fp, log)
	if ok {
		a.metrics.reuseHits.WithLabelValues(reuseObject).Inc()
		log.Info("artifact uploaded by another replica, reusing it", "object_key", built.ObjectKey)
	}
	return built, ok
}
