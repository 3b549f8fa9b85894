package spool

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

func TestArtifactsListAndPending(t *testing.T) {
	ctx := context.Background()
	s := openTest(t)
	now := time.Unix(1_800_000_000, 0)
	s.now = func() time.Time { return now }
	for i, id := range []string{"rfs-old", "rfs-mid", "rfs-new"} {
		now = now.Add(time.Minute)
		if err := s.PutArtifact(ctx, Artifact{ID: id, Fingerprint: "fp" + string(rune('a'+i)), Path: "/s/" + id,
			SHA256: "00", Size: 1, ModTime: now}); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := s.DeliveredArtifacts(ctx, now.Add(time.Hour), "", 10); err != nil || len(got) != 0 {
		t.Errorf("DeliveredArtifacts before any BUILT report left = %+v, %v; want none", got, err)
	}
	pending := func(id string) bool {
		t.Helper()
		p, err := s.ArtifactPending(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if pending("rfs-old") {
		t.Error("an artifact no job refers to is pending")
	}
	mustEnqueue(t, s, "job-1")
	if err := s.SetFingerprint(ctx, "job-1", "fpa", "rfs-old"); err != nil {
		t.Fatal(err)
	}
	if !pending("rfs-old") {
		t.Error("a queued job's artifact is not pending")
	}
	if err := s.Finish(ctx, "job-1", StateBuilt, "READY", "", Report{Kind: KindTerminal, Body: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	if !pending("rfs-old") {
		t.Error("an artifact whose BUILT report is undelivered is not pending")
	}
	reps, err := s.Reports(ctx, "job-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reps {
		if err := s.RemoveReport(ctx, r.ID); err != nil {
			t.Fatal(err)
		}
	}
	if pending("rfs-old") {
		t.Error("an artifact whose reports were all delivered is still pending")
	}
	delivered := now
	got, err := s.DeliveredArtifacts(ctx, now.Add(time.Millisecond), "", 10)
	if err != nil || len(got) != 1 || got[0].ID != "rfs-old" || !got[0].DeliveredAt.Equal(delivered) {
		t.Fatalf("DeliveredArtifacts after the BUILT left = %+v, %v; want rfs-old delivered at %s", got, err, delivered)
	}
	if got, err := s.DeliveredArtifacts(ctx, delivered, "", 10); err != nil || len(got) != 0 {
		t.Errorf("DeliveredArtifacts with the cutoff at the delivery = %+v, %v; want none", got, err)
	}
	// A later BUILT naming it (a reuse) moves the delivery time; the
	// record's other fields do not touch it.
	now = now.Add(time.Hour)
	mustEnqueue(t, s, "job-2")
	if err := s.SetFingerprint(ctx, "job-2", "fpa", "rfs-old"); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, "job-2", StateBuilt, "READY", "", Report{Kind: KindTerminal, Body: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	reps, err = s.Reports(ctx, "job-2")
	if err != nil || len(reps) != 1 {
		t.Fatalf("reports of job-2: %v %v", reps, err)
	}
	if err := s.RemoveReport(ctx, reps[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := s.PutArtifact(ctx, Artifact{ID: "rfs-old", Fingerprint: "fpa", Path: "/s/rfs-old", SHA256: "00", Size: 1, ModTime: now}); err != nil {
		t.Fatal(err)
	}
	got, err = s.DeliveredArtifacts(ctx, now.Add(time.Millisecond), "", 10)
	if err != nil || len(got) != 1 || !got[0].DeliveredAt.Equal(now) {
		t.Errorf("after a second BUILT = %+v, %v; want delivered at %s", got, err, now)
	}
	// A FAILED job's report does not count as a delivery.
	mustEnqueue(t, s, "job-3")
	if err := s.SetFingerprint(ctx, "job-3", "fpb", "rfs-mid"); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, "job-3", StateFailed, "READY", "boom", Report{Kind: KindTerminal, Body: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	reps, _ = s.Reports(ctx, "job-3")
	for _, r := range reps {
		if err := s.RemoveReport(ctx, r.ID); err != nil {
			t.Fatal(err)
		}
	}
	got, err = s.DeliveredArtifacts(ctx, now.Add(time.Hour), "", 10)
	if err != nil || len(got) != 1 || got[0].ID != "rfs-old" {
		t.Errorf("after a FAILED report = %+v, %v; want rfs-old alone", got, err)
	}
	// Pages follow the artifact id.
	if got, err := s.DeliveredArtifacts(ctx, now.Add(time.Hour), "rfs-old", 10); err != nil || len(got) != 0 {
		t.Errorf("the page after rfs-old = %+v, %v; want none", got, err)
	}
}

// TestMigrationDatesOldArtifactsFromTheUpgrade: artifacts recorded before
// delivery times were kept count as delivered at the upgrade, so an orphan
// sweep gives them its whole age from then.
func TestMigrationDatesOldArtifactsFromTheUpgrade(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "spool.db")
	old, err := open(ctx, path, false, busyTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if err := old.migrate(ctx, 3); err != nil {
		t.Fatalf("migrate to v3: %v", err)
	}
	if _, err := old.db.Exec(`INSERT INTO artifacts (artifact_id, fingerprint, path, sha256, size, mtime_ns, result, created_at)
		VALUES ('rfs-1', 'fp', '/x', 'ab', 1, 0, '{}', 1)`); err != nil {
		t.Fatal(err)
	}
	old.Close()
	before := time.Now().Add(-time.Second)
	s := openAt(t, path)
	got, err := s.DeliveredArtifacts(ctx, time.Now().Add(time.Second), "", 10)
	if err != nil || len(got) != 1 || got[0].DeliveredAt.Before(before) || got[0].DeliveredAt.After(time.Now()) {
		t.Errorf("DeliveredArtifacts after the upgrade = %+v, %v; want rfs-1 delivered at the upgrade", got, err)
	}
}
