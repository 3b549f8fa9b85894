package artifacts

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/agent/masterdb"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// TestOrphanNeedsTwoSightings: one pass that finds no row (a lagging or
// inconsistent read) removes nothing; a second pass removes the copy only
// when it comes at least a reconcile interval after the first, and a row
// seen again in between starts the count over.
func TestOrphanNeedsTwoSightings(t *testing.T) {
	const interval = 300 * time.Millisecond
	var present atomic.Bool
	rows := &fakeRows{artifact: func(id string) (masterdb.ArtifactRow, error) {
		if present.Load() {
			return masterdb.ArtifactRow{ArtifactID: id, Status: "READY"}, nil
		}
		return masterdb.ArtifactRow{}, masterdb.ErrArtifactNotFound
	}}
	a, _, b := testArtifacts(t, func(o *Options) {
		o.Rows = rows
		o.Replicas = func() config.Replicas { return config.Replicas{OrphanAge: 0, ReconcileInterval: interval} }
	})
	ctx := context.Background()
	req := obtained(t, a, b, 9)
	copyPath := a.store.ArtifactDir(req.ArtifactID)
	kept := func(want bool, what string) {
		t.Helper()
		if _, err := os.Stat(copyPath); (err == nil) != want {
			t.Fatalf("%s: copy present = %v (%v), want %v", what, err == nil, err, want)
		}
	}
	a.removeOrphans(ctx)
	kept(true, "first pass without a row")
	if n := testutil.ToFloat64(a.metrics.reconcile.orphansKept.WithLabelValues(orphanUnconfirmed)); n != 1 {
		t.Errorf("local_orphans_kept{reason=unconfirmed} = %v, want 1", n)
	}
	a.removeOrphans(ctx)
	kept(true, "a second pass within the reconcile interval")
	// The row is back on the next read: the earlier sighting is void, so a
	// pass more than an interval after it, but not after the new one,
	// keeps the copy.
	time.Sleep(interval)
	present.Store(true)
	a.removeOrphans(ctx)
	present.Store(false)
	a.removeOrphans(ctx)
	kept(true, "a pass right after one that found the row")
	// A pass an interval after the new first sighting removes it.
	time.Sleep(interval)
	a.removeOrphans(ctx)
	kept(false, "a pass an interval after the first sighting")
	if n := testutil.ToFloat64(a.metrics.reconcile.orphans); n != 1 {
		t.Errorf("local_removed_total = %v, want 1", n)
	}
	if _, err := a.index.ArtifactByFingerprint(ctx, req.Fingerprint); !errors.Is(err, spool.ErrNotFound) {
		t.Errorf("record of the removed copy: %v, want it forgotten", err)
	}
}
