package spool

import (
	"context"
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
	got, err := s.Artifacts(ctx, now, 10)
	if err != nil || len(got) != 2 || got[0].ID != "rfs-old" || got[1].ID != "rfs-mid" {
		t.Errorf("Artifacts before the newest = %+v, %v; want old and mid, oldest first", got, err)
	}
	if got, err := s.Artifacts(ctx, now.Add(time.Hour), 1); err != nil || len(got) != 1 || got[0].ID != "rfs-old" {
		t.Errorf("Artifacts limit 1 = %+v, %v", got, err)
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
}
