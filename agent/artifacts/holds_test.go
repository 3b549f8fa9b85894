package artifacts

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
)

// TestHoldsKeepDeletesOut: a held artifact refuses deletes until every
// hold on it is released; a second Release of a hold releases nothing
// more.
func TestHoldsKeepDeletesOut(t *testing.T) {
	a, _, b := testArtifacts(t, nil)
	ctx := context.Background()
	req := obtained(t, a, b, 6)
	first, second := a.Hold(req.ArtifactID), a.Hold(req.ArtifactID)
	if err := a.Delete(ctx, req.ArtifactID); !errors.Is(err, ErrBuilding) {
		t.Fatalf("Delete while held = %v, want ErrBuilding", err)
	}
	first.Release()
	first.Release()
	if err := a.Delete(ctx, req.ArtifactID); !errors.Is(err, ErrBuilding) {
		t.Fatalf("Delete with one hold left (the other released twice) = %v, want ErrBuilding", err)
	}
	second.Release()
	if err := a.Delete(ctx, req.ArtifactID); err != nil {
		t.Fatalf("Delete once released = %v", err)
	}
	if _, err := os.Stat(a.store.ArtifactDir(req.ArtifactID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("artifact directory after Delete: %v", err)
	}
}

// TestDeleteRefusesUnreported: an artifact named in a report CubeMaster has
// not received stays.
func TestDeleteRefusesUnreported(t *testing.T) {
	a, index, b := testArtifacts(t, nil)
	ctx := context.Background()
	req := obtained(t, a, b, 7)
	index.pending[req.ArtifactID] = true
	if err := a.Delete(ctx, req.ArtifactID); !errors.Is(err, ErrReported) {
		t.Fatalf("Delete of an unreported artifact = %v, want ErrReported", err)
	}
}

// TestAcceptWaitsForHolds: an upload of a held artifact is refused and
// leaves nothing behind; once released it is installed, and the same image
// again is kept as it is.
func TestAcceptWaitsForHolds(t *testing.T) {
	a, _, _ := testArtifacts(t, nil)
	ctx := context.Background()
	const id = "rfs-000000000000000000000008"
	image := []byte("uploaded image")
	h := a.Hold(id)
	if _, err := a.Accept(ctx, id, bytes.NewReader(image)); !errors.Is(err, ErrBuilding) {
		t.Fatalf("Accept while held = %v, want ErrBuilding", err)
	}
	if entries, _ := os.ReadDir(a.store.ArtifactDir(id)); len(entries) != 0 {
		t.Errorf("after a refused Accept the artifact directory holds %d entries, want none", len(entries))
	}
	h.Release()
	acc, err := a.Accept(ctx, id, bytes.NewReader(image))
	if err != nil || acc.Reused || acc.Size != int64(len(image)) {
		t.Fatalf("Accept = %+v, %v; want it installed", acc, err)
	}
	if got, err := os.ReadFile(acc.Path); err != nil || !bytes.Equal(got, image) {
		t.Errorf("installed image = %q, %v; want %q", got, err, image)
	}
	if again, err := a.Accept(ctx, id, bytes.NewReader(image)); err != nil || !again.Reused {
		t.Errorf("Accept of the same image = %+v, %v; want it reused", again, err)
	}
	if _, err := a.Accept(ctx, id, bytes.NewReader(nil)); !errors.Is(err, ErrEmpty) {
		t.Errorf("Accept of an empty body = %v, want ErrEmpty", err)
	}
}
