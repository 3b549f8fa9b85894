package artifacts

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/agent/masterdb"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// fakeIndex is the spool's artifact table in memory; it counts its writes
// and lookups.
type fakeIndex struct {
	mu      sync.Mutex
	byID    map[string]spool.Artifact
	pending map[string]bool
	puts    int
	lookups int
}

var _ Index = (*fakeIndex)(nil)

func newFakeIndex() *fakeIndex {
	return &fakeIndex{byID: map[string]spool.Artifact{}, pending: map[string]bool{}}
}

func (x *fakeIndex) ArtifactByFingerprint(_ context.Context, fp string) (spool.Artifact, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.lookups++
	for _, a := range x.byID {
		if a.Fingerprint == fp {
			return a, nil
		}
	}
	return spool.Artifact{}, spool.ErrNotFound
}

func (x *fakeIndex) PutArtifact(_ context.Context, a spool.Artifact) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.puts++
	x.byID[a.ID] = a
	return nil
}

func (x *fakeIndex) DeleteArtifact(_ context.Context, id string) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.byID, id)
	return nil
}

func (x *fakeIndex) ArtifactPending(_ context.Context, id string) (bool, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.pending[id], nil
}

// DeliveredArtifacts returns every artifact, delivered an hour ago.
func (x *fakeIndex) DeliveredArtifacts(_ context.Context, _ time.Time, after string, limit int) ([]spool.Artifact, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []spool.Artifact
	for id, a := range x.byID {
		if id > after && len(out) < limit {
			a.DeliveredAt = time.Now().Add(-time.Hour)
			out = append(out, a)
		}
	}
	return out, nil
}

// fakeRows is CubeMaster's database as Obtain and the sweeps use it: READY
// rows by fingerprint, rows by id, and a build lock that is either held by
// another replica or unreachable. Funcs left nil answer "none".
type fakeRows struct {
	ready    func(fp string) (masterdb.ArtifactRow, error)
	artifact func(id string) (masterdb.ArtifactRow, error)
	// tryLock answers TryLock; nil grants it (without a lock to release).
	tryLock func() (bool, error)
}

var _ Rows = (*fakeRows)(nil)

func (f *fakeRows) ReadyArtifact(_ context.Context, fp string) (masterdb.ArtifactRow, error) {
	if f.ready == nil {
		return masterdb.ArtifactRow{}, masterdb.ErrArtifactNotFound
	}
	return f.ready(fp)
}

func (f *fakeRows) Artifact(_ context.Context, id string) (masterdb.ArtifactRow, error) {
	if f.artifact == nil {
		return masterdb.ArtifactRow{}, masterdb.ErrArtifactNotFound
	}
	return f.artifact(id)
}

func (f *fakeRows) ClaimArtifact(context.Context, string) (masterdb.ArtifactRow, bool, error) {
	return masterdb.ArtifactRow{}, false, masterdb.ErrArtifactNotFound
}

func (f *fakeRows) DeleteClaimed(context.Context, string) error { return nil }

func (f *fakeRows) ReleaseClaim(context.Context, string, string) error { return nil }

func (f *fakeRows) StaleCleanups(context.Context, time.Duration, int) ([]string, error) {
	return nil, nil
}

func (f *fakeRows) TryLock(context.Context, string, masterdb.LockOptions) (*masterdb.Lock, bool, error) {
	if f.tryLock == nil {
		return nil, true, nil
	}
	ok, err := f.tryLock()
	return nil, ok, err
}

// fakeBuilder builds an image of fixed content into the store and counts
// its builds.
type fakeBuilder struct {
	store rootfs.Store
	mu    sync.Mutex
	n     int
}

func (b *fakeBuilder) build(id string) func(context.Context) (*rootfs.Artifact, error) {
	return func(context.Context) (*rootfs.Artifact, error) {
		b.mu.Lock()
		b.n++
		b.mu.Unlock()
		data := []byte("ext4 image of " + id)
		f, err := b.store.CreateTemp(id)
		if err != nil {
			return nil, err
		}
		if _, err := f.Write(data); err != nil {
			b.store.Discard(f, id)
			return nil, err
		}
		if err := b.store.Commit(f, id); err != nil {
			return nil, err
		}
		fi, err := os.Stat(b.store.ArtifactPath(id))
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(data)
		return &rootfs.Artifact{ID: id, Path: b.store.ArtifactPath(id), SHA256: hex.EncodeToString(sum[:]),
			Size: fi.Size(), ModTime: fi.ModTime()}, nil
	}
}

func (b *fakeBuilder) builds() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

// testArtifacts returns artifacts over a fake index and a store in a
// temporary directory; edit adjusts the options first.
func testArtifacts(t *testing.T, edit func(*Options)) (*Artifacts, *fakeIndex, *fakeBuilder) {
	t.Helper()
	store := rootfs.Store(t.TempDir())
	index := newFakeIndex()
	o := Options{Index: index, Store: store, Logger: slog.New(slog.DiscardHandler),
		Replicas: func() config.Replicas {
			return config.Replicas{LockPollInterval: 10 * time.Millisecond, LockKeepalive: time.Second}
		}}
	if edit != nil {
		edit(&o)
	}
	return New(o), index, &fakeBuilder{store: store}
}

// testRequest asks for the artifact of fingerprint n (a digit), built by b.
func testRequest(b *fakeBuilder, n int) Request {
	fp := fmt.Sprintf("%064d", n)
	id := fmt.Sprintf("rfs-%024d", n)
	return Request{Fingerprint: fp, ArtifactID: id, Image: &rootfs.Image{Digest: "registry.test/app@sha256:" + fp},
		Build: b.build(id)}
}

// obtained builds the artifact of fingerprint n with a and returns its
// request.
func obtained(t *testing.T, a *Artifacts, b *fakeBuilder, n int) Request {
	t.Helper()
	req := testRequest(b, n)
	if _, _, err := a.Obtain(context.Background(), req); err != nil {
		t.Fatalf("Obtain: %v", err)
	}
	return req
}

// errUnreachable is a database that cannot be reached.
var errUnreachable = fmt.Errorf("dial: %w", masterdb.ErrUnavailable)

// errNotCalled fails a step a test does not expect.
var errNotCalled = errors.New("not expected")
