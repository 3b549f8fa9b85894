// Package artifacts owns the artifacts this replica builds or reuses:
// where each one's data lives (the local store, the spool's record of it,
// the blob store's object and its signed record, CubeMaster's artifact
// row), whether an existing one can answer a job instead of a build
// (Obtain, under the fingerprint's build lock shared with other replicas),
// its publication to the blob store, uploads, holds, its deletion, and the
// sweeps that remove what CubeMaster marked or forgot. It answers with typed errors; the
// daemon turns them into HTTP statuses.
package artifacts

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/agent/masterdb"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// Index is the spool's record of the artifacts published here.
type Index interface {
	ArtifactByFingerprint(ctx context.Context, fingerprint string) (spool.Artifact, error)
	PutArtifact(ctx context.Context, a spool.Artifact) error
	DeleteArtifact(ctx context.Context, id string) error
	// ArtifactPending reports whether a job still needs the artifact or
	// names it in a report CubeMaster has not received.
	ArtifactPending(ctx context.Context, id string) (bool, error)
	// DeliveredArtifacts pages through the artifacts whose reports all
	// reached CubeMaster before cutoff.
	DeliveredArtifacts(ctx context.Context, cutoff time.Time, after string, limit int) ([]spool.Artifact, error)
}

var _ Index = (*spool.Spool)(nil)

// Rows is what artifacts need of CubeMaster's database: READY rows to
// reuse, the rows deletes claim and the sweep lists, and the locks that
// keep replicas out of each other's way.
type Rows interface {
	ReadyArtifact(ctx context.Context, fingerprint string) (masterdb.ArtifactRow, error)
	Artifact(ctx context.Context, artifactID string) (masterdb.ArtifactRow, error)
	ClaimArtifact(ctx context.Context, artifactID string) (masterdb.ArtifactRow, bool, error)
	DeleteClaimed(ctx context.Context, artifactID string) error
	ReleaseClaim(ctx context.Context, artifactID, lastError string) error
	StaleCleanups(ctx context.Context, age time.Duration, limit int) ([]string, error)
	TryLock(ctx context.Context, name string, o masterdb.LockOptions) (*masterdb.Lock, bool, error)
}

var _ Rows = (*masterdb.DB)(nil)

// Options are what Artifacts works with.
type Options struct {
	// Index is the spool's artifact table.
	Index Index
	// Store is the local artifact store.
	Store rootfs.Store
	// BlobStore is the blob store keeping the durable copy of each artifact;
	// nil keeps artifacts on the local store only.
	BlobStore blobstore.Store
	// Prefix is the object key prefix.
	Prefix string
	// PresignTTL is how long the artifact_url of an S3 object stays valid.
	PresignTTL time.Duration
	// KeepLocal keeps the local image after a verified upload.
	KeepLocal bool
	// RecordSecret signs the records stored beside objects; empty stores
	// and adopts none.
	RecordSecret string
	// Rows is CubeMaster's database; nil when TC works alone.
	Rows Rows
	// Replicas is read at each use, so a reload takes effect at once.
	Replicas func() config.Replicas
	// AbandonAfter is read at each upload: how old another upload of the
	// same key must be before it is aborted (build.timeout). Nil, or TC
	// alone, aborts every earlier one.
	AbandonAfter func() time.Duration
	Logger       *slog.Logger
	// Metrics registers the series; names are relative to the daemon's
	// namespace.
	Metrics prometheus.Registerer
}

// Artifacts decides, publishes and deletes artifacts.
type Artifacts struct {
	index     Index
	store     rootfs.Store
	publisher *publisher
	rows      Rows
	replicas  func() config.Replicas
	logger    *slog.Logger
	metrics   metrics

	// mu guards inUse.
	mu sync.Mutex
	// inUse counts the holds on each artifact a build or reuse is working
	// on, so a delete (or an upload) of the same artifact waits its turn.
	inUse map[string]int
	// orphansSeen holds, for each local copy the last reconcile pass found
	// without a database row, when a pass first found it so; only the
	// reconcile loop uses it.
	orphansSeen map[string]time.Time
}

// Errors of Delete and of an upload's publication. The daemon answers 409
// to each, 503 to ErrDatabaseUnavailable and 400 to ErrEmpty.
var (
	// ErrBuilding refuses a delete of an artifact being built or reused
	// here, or by another replica (its build lock is held).
	ErrBuilding = errors.New("artifact is being built")
	// ErrReported refuses a delete of an artifact a job of this replica is
	// about to report or has reported BUILT without CubeMaster having
	// received it yet: CubeMaster would register an artifact whose data is
	// gone.
	ErrReported = errors.New("artifact is named in a job report CubeMaster has not received yet")
	// ErrNotMarked refuses a delete of an artifact whose row CubeMaster has
	// not marked CLEANUP_PENDING.
	ErrNotMarked = errors.New("artifact is not marked for deletion in CubeMaster's database")
	// ErrDatabaseUnavailable is a step that needs CubeMaster's database
	// when it cannot be reached; a retry may succeed.
	ErrDatabaseUnavailable = errors.New("CubeMaster's database is unavailable")
	// ErrObjectMissing reports an artifact with neither an intact object
	// nor a local image to upload again: it must be rebuilt.
	ErrObjectMissing = errors.New("artifact object missing and no local copy to upload")
	// ErrEmpty refuses an upload of an empty image.
	ErrEmpty = errors.New("empty image")
)

// New returns the artifacts of o.
func New(o Options) *Artifacts {
	a := &Artifacts{
		index:    o.Index,
		store:    o.Store,
		rows:     o.Rows,
		replicas: o.Replicas,
		logger:   o.Logger,
		metrics:  newMetrics(),
		inUse:    map[string]int{},
	}
	if a.replicas == nil {
		a.replicas = func() config.Replicas { return config.Replicas{} }
	}
	reg := o.Metrics
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if o.BlobStore != nil {
		a.publisher = &publisher{blobs: o.BlobStore, prefix: o.Prefix, presignTTL: o.PresignTTL,
			keepLocal: o.KeepLocal, recordKey: deriveRecordKey(o.RecordSecret),
			logger: o.Logger.With("component", "blobstore"), metrics: a.metrics.objects}
		if o.Rows != nil {
			// Other replicas upload to the same keys; none of their
			// uploads outlives its build.timeout.
			a.publisher.abandonAfter = o.AbandonAfter
		}
		a.metrics.objects.register(reg)
	}
	if o.Rows != nil {
		a.metrics.register(reg)
	}
	return a
}

// Objects is the blob store, nil for none.
func (a *Artifacts) Objects() blobstore.Store {
	if a.publisher == nil {
		return nil
	}
	return a.publisher.blobs
}

// Signed reports whether records beside objects are signed, so replicas
// can adopt each other's uploads.
func (a *Artifacts) Signed() bool { return a.publisher != nil && a.publisher.recordKey != nil }

// Holding is a build's or a reuse's hold on an artifact, from Hold to its
// Release: deletes and uploads of the artifact are refused meanwhile.
type Holding struct {
	a    *Artifacts
	id   string
	once sync.Once
}

// Hold marks artifact id in use by a build or reuse until the returned
// Holding is released. It waits for a delete or an upload of the artifact
// that is running; later ones are refused (ErrBuilding) until Release.
func (a *Artifacts) Hold(id string) *Holding {
	a.mu.Lock()
	a.inUse[id]++
	a.mu.Unlock()
	return &Holding{a: a, id: id}
}

// Release ends the hold; a second call does nothing.
func (h *Holding) Release() {
	h.once.Do(func() {
		h.a.mu.Lock()
		defer h.a.mu.Unlock()
		if h.a.inUse[h.id]--; h.a.inUse[h.id] <= 0 {
			delete(h.a.inUse, h.id)
		}
	})
}

// whenIdle runs fn unless artifact id is held, and returns fn's error, or
// ErrBuilding when it did not run. No Hold of the artifact begins while fn
// runs.
func (a *Artifacts) whenIdle(id string, fn func() error) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inUse[id] > 0 {
		return ErrBuilding
	}
	return fn()
}
