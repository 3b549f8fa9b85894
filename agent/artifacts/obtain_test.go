package artifacts

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
	"github.com/cubesandbox/cubetemplatecenter/agent/masterdb"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
)

// TestObtainBuildsOnceThenReusesLocal: alone, the first ask builds and
// records the artifact; the next one reuses the local copy without a build.
func TestObtainBuildsOnceThenReusesLocal(t *testing.T) {
	a, index, b := testArtifacts(t, nil)
	ctx := context.Background()
	req := testRequest(b, 1)
	built, src, err := a.Obtain(ctx, req)
	if err != nil || src != SourceBuilt {
		t.Fatalf("first Obtain = %v, %v; want a build", src, err)
	}
	if built.ArtifactID != req.ArtifactID || built.Fingerprint != req.Fingerprint || built.Ext4SizeBytes == 0 {
		t.Errorf("first Obtain = %+v, want the artifact of the request", built)
	}
	again, src, err := a.Obtain(ctx, req)
	if err != nil || src != SourceLocal {
		t.Fatalf("second Obtain = %v, %v; want the local copy", src, err)
	}
	if *again != *built {
		t.Errorf("second Obtain:\n got %+v\nwant %+v", *again, *built)
	}
	if b.builds() != 1 || index.puts != 1 {
		t.Errorf("builds %d, record writes %d; want 1 and 1", b.builds(), index.puts)
	}
}

// TestObtainPublishesToBlobStore: a build is uploaded, its record gets the
// blob fields in one more write without reading it back, and the progress
// hooks run; the next ask reuses it without uploading again.
func TestObtainPublishesToBlobStore(t *testing.T) {
	objects, err := blobstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a, index, b := testArtifacts(t, func(o *Options) { o.BlobStore = objects; o.KeepLocal = true })
	ctx := context.Background()
	req := testRequest(b, 2)
	var publishing atomic.Int32
	req.Publishing = func(context.Context) { publishing.Add(1) }
	built, src, err := a.Obtain(ctx, req)
	if err != nil || src != SourceBuilt {
		t.Fatalf("Obtain = %v, %v; want a build", src, err)
	}
	if built.ObjectKey != blobstore.ArtifactKey("", req.ArtifactID) || built.StorageBackend != objects.Backend() {
		t.Errorf("Obtain = object %q on %q, want %q on %q", built.ObjectKey, built.StorageBackend,
			blobstore.ArtifactKey("", req.ArtifactID), objects.Backend())
	}
	if publishing.Load() != 1 {
		t.Errorf("Publishing called %d times, want 1", publishing.Load())
	}
	// One lookup (the local reuse that found nothing), the record of the
	// build and its rewrite with the blob fields.
	if index.lookups != 1 || index.puts != 2 {
		t.Errorf("index lookups %d, writes %d; want 1 and 2", index.lookups, index.puts)
	}
	_, rec, ok := a.recorded(ctx, req.Fingerprint, a.logger)
	if !ok || rec.ObjectKey != built.ObjectKey {
		t.Errorf("record after publication = %+v, %v; want the object key %q", rec, ok, built.ObjectKey)
	}
	if _, src, err := a.Obtain(ctx, req); err != nil || src != SourceLocal {
		t.Errorf("second Obtain = %v, %v; want the local copy", src, err)
	}
	if b.builds() != 1 {
		t.Errorf("builds = %d, want 1", b.builds())
	}
}

// TestObtainWaitsForLockThenReusesRow: while another replica holds the
// build lock, Obtain waits, and answers with the READY row that replica
// registers, without building.
func TestObtainWaitsForLockThenReusesRow(t *testing.T) {
	var polls atomic.Int32
	rows := &fakeRows{tryLock: func() (bool, error) { return false, nil }}
	a, _, b := testArtifacts(t, func(o *Options) { o.Rows = rows })
	ctx := context.Background()
	// The other replica's image, in a shared store this one reads.
	other := testRequest(b, 3)
	art, err := other.Build(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rows.ready = func(string) (masterdb.ArtifactRow, error) {
		if polls.Add(1) < 3 {
			return masterdb.ArtifactRow{}, masterdb.ErrArtifactNotFound
		}
		return masterdb.ArtifactRow{ArtifactID: art.ID, Fingerprint: other.Fingerprint, Ext4Path: art.Path,
			Ext4SHA256: art.SHA256, Ext4SizeBytes: art.Size}, nil
	}
	req := testRequest(b, 3)
	req.Build = func(context.Context) (*rootfs.Artifact, error) { return nil, errNotCalled }
	built, src, err := a.Obtain(ctx, req)
	if err != nil || src != SourceRow {
		t.Fatalf("Obtain = %v, %v; want the READY row", src, err)
	}
	if built.Ext4Path != art.Path {
		t.Errorf("Obtain = %s, want the row's %s", built.Ext4Path, art.Path)
	}
}

// TestObtainBuildsWithoutUnreachableDatabase: a database that cannot be
// reached for the lock costs at worst a duplicate build, never the job.
func TestObtainBuildsWithoutUnreachableDatabase(t *testing.T) {
	var tries atomic.Int32
	rows := &fakeRows{tryLock: func() (bool, error) { tries.Add(1); return false, errUnreachable }}
	a, _, b := testArtifacts(t, func(o *Options) { o.Rows = rows })
	_, src, err := a.Obtain(context.Background(), testRequest(b, 4))
	if err != nil || src != SourceBuilt {
		t.Fatalf("Obtain = %v, %v; want a build without the lock", src, err)
	}
	if tries.Load() != lockUnavailableTries {
		t.Errorf("lock tries = %d, want %d", tries.Load(), lockUnavailableTries)
	}
	if n := testutil.ToFloat64(a.metrics.lockUnavailable); n != 1 {
		t.Errorf("lock_unavailable_total = %v, want 1", n)
	}
}

// TestObtainBuildsOnceLockIsFree: a lock another replica held, released
// without a READY row (its build failed), is taken and the artifact built;
// the wait is counted once.
func TestObtainBuildsOnceLockIsFree(t *testing.T) {
	var tries atomic.Int32
	rows := &fakeRows{tryLock: func() (bool, error) { return tries.Add(1) > 2, nil }}
	a, _, b := testArtifacts(t, func(o *Options) { o.Rows = rows })
	if _, src, err := a.Obtain(context.Background(), testRequest(b, 10)); err != nil || src != SourceBuilt {
		t.Fatalf("Obtain = %v, %v; want a build once the lock is free", src, err)
	}
	if n := testutil.ToFloat64(a.metrics.lockWaits); n != 1 || b.builds() != 1 {
		t.Errorf("lock_waits_total = %v, builds %d; want 1 and 1", n, b.builds())
	}
}

// TestObtainStopsWaitingWithContext: an ended context ends the wait for
// another replica's lock with the context's error.
func TestObtainStopsWaitingWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	rows := &fakeRows{tryLock: func() (bool, error) { cancel(); return false, nil }}
	a, _, b := testArtifacts(t, func(o *Options) { o.Rows = rows })
	_, _, err := a.Obtain(ctx, testRequest(b, 5))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Obtain = %v, want context.Canceled", err)
	}
	if b.builds() != 0 {
		t.Errorf("builds = %d, want none", b.builds())
	}
}
