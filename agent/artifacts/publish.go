package artifacts

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
	"github.com/cubesandbox/cubetemplatecenter/agent/tracing"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
)

// publisher keeps the durable copy of each artifact in the blob
// store: it uploads a published image, verifies the object, and reports
// its blob fields. A nil *publisher means no blob store: artifacts live on
// the local store only.
type publisher struct {
	blobs  blobstore.Store
	prefix string
	// recordKey signs and checks the records stored beside objects; nil
	// means none are written or adopted (artifact_store.record_secret
	// unset).
	recordKey []byte
	// abandonAfter is how old an incomplete upload of an artifact's key
	// must be before an upload of the same key aborts it: younger ones
	// may be another replica's, still running. Zero aborts every earlier
	// one (TC works alone).
	abandonAfter func() time.Duration
	// presignTTL is how long the artifact_url of an S3 object stays valid.
	presignTTL time.Duration
	// keepLocal keeps the local image after a verified upload.
	keepLocal bool
	logger    *slog.Logger
	metrics   objectMetrics
}

// objectMetrics are the series the publisher updates.
type objectMetrics struct {
	uploadBytes    prometheus.Counter
	uploadDuration prometheus.Histogram
	failures       *prometheus.CounterVec
	fallbacks      prometheus.Counter
	verifiedReuses prometheus.Counter
	badRecords     *prometheus.CounterVec
}

func newObjectMetrics() objectMetrics {
	m := objectMetrics{
		uploadBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: "blobstore", Name: "upload_bytes_total",
			Help: "Artifact bytes uploaded to the blob store.",
		}),
		uploadDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Subsystem: "blobstore", Name: "upload_duration_seconds",
			Help:    "Time to upload and verify one artifact.",
			Buckets: []float64{0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800},
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "blobstore", Name: "failures_total",
			Help: "Blob store operations that failed after their retries, by operation.",
		}, []string{"op"}),
		fallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: "blobstore", Name: "fallbacks_total",
			Help: "Builds reported with the local artifact only because the S3 upload failed.",
		}),
		verifiedReuses: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: "blobstore", Name: "verified_reuses_total",
			Help: "Reused artifacts whose object was found intact in the blob store.",
		}),
		badRecords: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: "blobstore", Name: "records_rejected_total",
			Help: "Artifact records found beside objects and not trusted (the artifact was built instead), by reason.",
		}, []string{"reason"}),
	}
	for _, op := range []string{opStat, opUpload, opPresign, opForeignKey, opDelete, opRecord} {
		m.failures.WithLabelValues(op)
	}
	for _, r := range []string{recordUnsigned, recordSignature, recordMismatch} {
		m.badRecords.WithLabelValues(r)
	}
	return m
}

// Blob store operations, the op label of blobstore_failures_total.
const (
	opStat       = "stat"
	opUpload     = "upload"
	opPresign    = "presign"
	opForeignKey = "foreign_key"
	opDelete     = "delete"
	opRecord     = "record"
)

func (m objectMetrics) register(reg prometheus.Registerer) {
	reg.MustRegister(m.uploadBytes, m.uploadDuration, m.failures, m.fallbacks, m.verifiedReuses, m.badRecords)
}

// ensure makes sure built's artifact is in the blob store and returns built
// with its blob fields set. An intact object (size and sha256 as built) is
// reused; otherwise the local image is uploaded and verified. progress
// receives the share uploaded (0..1). When the upload fails for good, the
// S3 backend falls back to the local artifact (built without blob fields,
// as upstream does) and the fs backend returns the error.
func (p *publisher) ensure(ctx context.Context, built *api.Built, progress func(float64)) (*api.Built, error) {
	if p == nil {
		return built, nil
	}
	key := blobstore.ArtifactKey(p.prefix, built.ArtifactID)
	log := p.logger.With("artifact_id", built.ArtifactID, "object_key", key)
	out := *built
	out.StorageBackend, out.ObjectKey, out.ArtifactURL = "", "", ""
	info, err := p.blobs.Stat(ctx, key)
	intact := err == nil && info.Size == built.Ext4SizeBytes && info.SHA256 == built.Ext4SHA256
	// An object this replica uploaded or verified before carries its key
	// in built (the spool's record); any other one is checked before this
	// replica vouches for it.
	known := built.ObjectKey == key
	var contentErr error
	if intact && !known {
		// Where the backend allows, its content is hashed.
		_, contentErr = p.checkContent(ctx, key, built.Ext4SHA256)
		intact = contentErr == nil
	}
	switch {
	case intact:
		p.metrics.verifiedReuses.Inc()
		if !known {
			// The record beside it may be missing, or one no replica
			// signed (planted): this one replaces it, so other replicas
			// adopt the object again.
			p.putRecord(ctx, built, info, log)
		}
		return p.withFields(ctx, &out, key, log)
	case err == nil:
		log.Warn("object differs from the artifact, uploading it again", "size", info.Size, "sha256", info.SHA256,
			"content_err", contentErr)
	case !errors.Is(err, blobstore.ErrNotFound):
		p.metrics.failures.WithLabelValues(opStat).Inc()
		return p.fallback(&out, log, fmt.Errorf("stat artifact object %s: %w", key, err))
	}
	if _, err := os.Stat(built.Ext4Path); errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("artifact %s: %w", built.ArtifactID, ErrObjectMissing)
	}
	info, err = tracing.Run(ctx, tracing.SpanUpload, func(ctx context.Context) (blobstore.Info, error) {
		return p.upload(ctx, key, built, progress)
	}, attribute.String(tracing.AttrStorageBackend, p.blobs.Backend()))
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		p.metrics.failures.WithLabelValues(opUpload).Inc()
		return p.fallback(&out, log, err)
	}
	p.putRecord(ctx, built, info, log)
	res, err := p.withFields(ctx, &out, key, log)
	if err != nil {
		return nil, err
	}
	if !p.keepLocal {
		if err := os.Remove(built.Ext4Path); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.Warn("remove local copy after upload", "err", err)
		}
	}
	return res, nil
}

// upload sends the local image to key and returns what the store holds,
// checked against the image.
func (p *publisher) upload(ctx context.Context, key string, built *api.Built, progress func(float64)) (blobstore.Info, error) {
	began := time.Now()
	p.logger.Info("uploading artifact", "artifact_id", built.ArtifactID, "object_key", key, "size", built.Ext4SizeBytes)
	// What an interrupted upload of this key left (an agent killed mid
	// multipart upload) goes first, so the bucket keeps no incomplete one;
	// but only what is too old to be another replica's upload in progress.
	// A failed upload of this one is removed by the store itself.
	cutoff := began
	if p.abandonAfter != nil {
		cutoff = began.Add(-p.abandonAfter())
	}
	if err := p.blobs.AbortIncomplete(ctx, key, cutoff); err != nil {
		return blobstore.Info{}, fmt.Errorf("abort earlier upload of %s: %w", key, err)
	}
	var err error
	if p.blobs.Abilities().LinkFiles {
		err = p.blobs.PutFile(ctx, key, built.Ext4Path, built.Ext4SizeBytes, built.Ext4SHA256)
	} else {
		var f *os.File
		if f, err = os.Open(built.Ext4Path); err != nil {
			return blobstore.Info{}, fmt.Errorf("open artifact for upload: %w", err)
		}
		defer f.Close()
		err = p.blobs.Put(ctx, key, &progressReader{r: f, total: built.Ext4SizeBytes, report: progress}, built.Ext4SizeBytes, built.Ext4SHA256)
	}
	if err != nil {
		return blobstore.Info{}, fmt.Errorf("upload artifact to %s: %w", key, err)
	}
	info, err := p.blobs.Stat(ctx, key)
	if err != nil {
		return blobstore.Info{}, fmt.Errorf("verify uploaded artifact %s: %w", key, err)
	}
	if info.Size != built.Ext4SizeBytes || info.SHA256 != built.Ext4SHA256 {
		return blobstore.Info{}, fmt.Errorf("verify uploaded artifact %s: stored %d bytes sha256 %s, want %d bytes sha256 %s",
			key, info.Size, info.SHA256, built.Ext4SizeBytes, built.Ext4SHA256)
	}
	p.metrics.uploadBytes.Add(float64(built.Ext4SizeBytes))
	p.metrics.uploadDuration.Observe(time.Since(began).Seconds())
	p.logger.Info("artifact uploaded", "artifact_id", built.ArtifactID, "object_key", key, "backend", p.blobs.Backend(),
		"size", built.Ext4SizeBytes, "took", time.Since(began).Round(time.Millisecond))
	return info, nil
}

// withFields sets the blob fields of a verified object: backend and key,
// and where the backend presigns (S3) a download URL.
func (p *publisher) withFields(ctx context.Context, b *api.Built, key string, log *slog.Logger) (*api.Built, error) {
	b.StorageBackend, b.ObjectKey = p.blobs.Backend(), key
	if p.blobs.Abilities().Presign {
		url, err := p.blobs.PresignGet(ctx, key, p.presignTTL)
		if err != nil {
			p.metrics.failures.WithLabelValues(opPresign).Inc()
			b.StorageBackend, b.ObjectKey = "", ""
			return p.fallback(b, log, fmt.Errorf("presign %s: %w", key, err))
		}
		b.ArtifactURL = url
	}
	return b, nil
}

// fallback ends a failed blob store step: a backend with a local fallback
// (S3) reports the local artifact (when it is still there); otherwise (fs)
// the job fails.
func (p *publisher) fallback(b *api.Built, log *slog.Logger, err error) (*api.Built, error) {
	if !p.blobs.Abilities().LocalFallback {
		return nil, err
	}
	if _, serr := os.Stat(b.Ext4Path); serr != nil {
		return nil, fmt.Errorf("%w (and the local copy is gone: %v)", err, serr)
	}
	p.metrics.fallbacks.Inc()
	log.Warn("blob store unavailable, reporting the local artifact only", "err", err)
	return b, nil
}

// remove deletes an artifact's object and its record, by the key derived
// from its id; a missing object is success. otherKey, another key the
// artifact was reported under (a database row's object_key), is deleted
// only when it is that same key: a row names any key it likes, and the
// bucket (or an fs root inside the store) holds other artifacts' data.
func (p *publisher) remove(ctx context.Context, artifactID, otherKey string) error {
	if p == nil {
		return nil
	}
	key := blobstore.ArtifactKey(p.prefix, artifactID)
	if otherKey != "" && otherKey != key {
		p.metrics.failures.WithLabelValues(opForeignKey).Inc()
		p.logger.Warn("artifact row names an object key that is not the artifact's own; left in place",
			"artifact_id", artifactID, "row_object_key", otherKey, "own_key", key)
	}
	// The object, then the record beside it: a failure between leaves a
	// record without object, which is never adopted.
	for _, del := range []string{key, recordObjectKey(key)} {
		if err := p.blobs.Delete(ctx, del); err != nil {
			p.metrics.failures.WithLabelValues(opDelete).Inc()
			return fmt.Errorf("delete artifact object %s: %w", del, err)
		}
	}
	return nil
}

// maxRecordBytes bounds an artifact record read back from the blob store:
// the image configuration is capped at 8 MiB when pulled.
const maxRecordBytes = 9 << 20

// recordObjectKey is the key of the record stored beside an artifact's
// object.
func recordObjectKey(objectKey string) string {
	return strings.TrimSuffix(objectKey, ".ext4") + ".json"
}

// putRecord stores the artifact's BUILT fields beside its verified object
// (info, as Stat found it), signed, so a replica that finds the object
// before CubeMaster registered it can report the artifact without building
// it. Without a record key none is stored. A failure only costs that: it is
// logged.
func (p *publisher) putRecord(ctx context.Context, built *api.Built, info blobstore.Info, log *slog.Logger) {
	if p.recordKey == nil {
		return
	}
	rec := *built
	rec.StorageBackend, rec.ObjectKey, rec.ArtifactURL, rec.MasterNodeIP = "", "", "", ""
	key := blobstore.ArtifactKey(p.prefix, built.ArtifactID)
	data, err := sealRecord(p.recordKey, key, info.ETag, rec)
	if err == nil {
		sum := sha256.Sum256(data)
		err = p.blobs.Put(ctx, recordObjectKey(key), bytes.NewReader(data), int64(len(data)), hex.EncodeToString(sum[:]))
	}
	if err != nil {
		p.metrics.failures.WithLabelValues(opRecord).Inc()
		log.Warn("store artifact record beside the object", "err", err)
	}
}

// Reasons an artifact record is not trusted, the reason label of
// blobstore_records_rejected_total.
const (
	recordUnsigned  = "unsigned"
	recordSignature = "signature"
	recordMismatch  = "mismatch"
)

// adopt returns the artifact of fingerprint fp as another replica stored
// it, when its object and record are both there, the record's signature
// checks out and the two agree (same artifact, fingerprint, size, sha256
// and, on S3, entity tag); ok is false otherwise, errors included. Without
// a record key nothing is adopted: an unsigned record could come from
// anyone who can write to the bucket.
func (p *publisher) adopt(ctx context.Context, artifactID, fp string, log *slog.Logger) (*api.Built, bool) {
	if p == nil || p.recordKey == nil {
		return nil, false
	}
	key := blobstore.ArtifactKey(p.prefix, artifactID)
	info, err := p.blobs.Stat(ctx, key)
	if err != nil {
		if !errors.Is(err, blobstore.ErrNotFound) {
			log.Warn("look for the artifact's object", "object_key", key, "err", err)
		}
		return nil, false
	}
	data, err := p.blobs.Get(ctx, recordObjectKey(key), maxRecordBytes)
	if err != nil {
		log.Warn("artifact object has no readable record; building it", "object_key", key, "err", err)
		return nil, false
	}
	rec, reason, err := openRecord(p.recordKey, key, info.ETag, data)
	if err == nil && (rec.ArtifactID != artifactID || rec.Fingerprint != fp ||
		rec.Ext4SizeBytes != info.Size || rec.Ext4SHA256 != info.SHA256 || info.SHA256 == "") {
		reason, err = recordMismatch, errors.New("the record does not describe the object beside it")
	}
	if err == nil {
		reason, err = p.checkContent(ctx, key, rec.Ext4SHA256)
	}
	if err != nil {
		p.metrics.badRecords.WithLabelValues(reason).Inc()
		log.Warn("artifact record beside the object is not trusted; building the artifact", "object_key", key,
			"reason", reason, "err", err)
		return nil, false
	}
	out, err := p.withFields(ctx, &rec, key, log)
	if err != nil || out.ObjectKey == "" {
		return nil, false
	}
	p.metrics.verifiedReuses.Inc()
	return out, true
}

// localObjects is the ability of a blob store whose objects are files on
// this host (fs).
type localObjects interface {
	// Path returns the file holding key's object.
	Path(key string) (string, error)
}

// checkContent hashes an object that is a local file against the sha256
// its record vouches for. On S3 the record's entity tag already ties it to
// the content; an fs object has no such tag, and its recorded sha256 is a
// file beside it that anyone who can replace the object can rewrite too.
func (p *publisher) checkContent(ctx context.Context, key, sha256hex string) (string, error) {
	local, ok := p.blobs.(localObjects)
	if !ok {
		return "", nil
	}
	path, err := local.Path(key)
	if err != nil {
		return recordMismatch, err
	}
	sum, err := rootfs.FileSHA256(ctx, path)
	if err != nil {
		return recordMismatch, fmt.Errorf("hash the object: %w", err)
	}
	if sum != sha256hex {
		return recordMismatch, fmt.Errorf("the object's content hashes to %s, the record says %s", sum, sha256hex)
	}
	return "", nil
}

// progressReader reports the share of total read so far.
type progressReader struct {
	r      io.Reader
	n      int64
	total  int64
	report func(float64)
}

func (pr *progressReader) Read(b []byte) (int, error) {
	n, err := pr.r.Read(b)
	pr.n += int64(n)
	if pr.report != nil && pr.total > 0 {
		pr.report(float64(pr.n) / float64(pr.total))
	}
	return n, err
}
