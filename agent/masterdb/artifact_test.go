package masterdb

import (
	"context"
	"errors"
	"testing"
	"time"
)

// insertArtifact adds an artifact row as CubeMaster does.
func insertArtifact(t *testing.T, d *DB, a ArtifactRow) {
	t.Helper()
	if _, err := d.db.Exec(d.bind("INSERT INTO t_cube_rootfs_artifact (artifact_id, template_spec_fingerprint, "+
		"source_image_digest, ext4_path, ext4_sha256, ext4_size_bytes, image_config_json, artifact_url, storage_backend, "+
		"object_key, cube_egress_ca_baked, cube_egress_ca_fingerprint, cube_egress_ca_targets_written, status) "+
		"VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"), a.ArtifactID, a.Fingerprint, a.SourceDigest, a.Ext4Path,
		a.Ext4SHA256, a.Ext4SizeBytes, a.ImageConfigJSON, a.ArtifactURL, a.StorageBackend, a.ObjectKey, a.CABaked,
		a.CAFingerprint, a.CATargets, a.Status); err != nil {
		t.Fatalf("insert artifact %s: %v", a.ArtifactID, err)
	}
}

// ageArtifact moves a row's updated_at back by d.
func ageArtifact(t *testing.T, db *DB, id string, d time.Duration) {
	t.Helper()
	q := "UPDATE t_cube_rootfs_artifact SET updated_at = updated_at - INTERVAL ? SECOND WHERE artifact_id = ?"
	if db.driver == DriverPostgres {
		q = "UPDATE t_cube_rootfs_artifact SET updated_at = updated_at - make_interval(secs => $1) WHERE artifact_id = $2"
	}
	if _, err := db.db.Exec(q, int(d.Seconds()), id); err != nil {
		t.Fatalf("age artifact %s: %v", id, err)
	}
}

func row(id, fp, status string) ArtifactRow {
	return ArtifactRow{ArtifactID: id, Fingerprint: fp, SourceDigest: "sha256:" + fp, Ext4Path: "/store/" + id + "/" + id + ".ext4",
		Ext4SHA256: "e3b0", Ext4SizeBytes: 4096, ImageConfigJSON: `{"Env":["A=1"]}`, ArtifactURL: "https://s3/x",
		StorageBackend: "s3", ObjectKey: "p/" + id + ".ext4", CABaked: true, CAFingerprint: "cafp", CATargets: 2, Status: status}
}

func TestReadyArtifact(t *testing.T) {
	for _, dl := range dialects {
		t.Run(dl.name, func(t *testing.T) {
			o, _, _ := dl.open(t)
			d := openDB(t, o)
			ctx := context.Background()
			want := row("art-1", "fp1", ArtifactReady)
			insertArtifact(t, d, want)
			insertArtifact(t, d, row("art-2", "fp2", ArtifactCleanupPending))
			got, err := d.ReadyArtifact(ctx, "fp1")
			if err != nil || got != want {
				t.Errorf("ReadyArtifact(fp1) = %+v, %v; want %+v", got, err, want)
			}
			if !got.StoreBacked() {
				t.Error("an s3 row is not store-backed")
			}
			for _, fp := range []string{"fp2", "fp3", "FP1"} {
				if _, err := d.ReadyArtifact(ctx, fp); !errors.Is(err, ErrArtifactNotFound) {
					t.Errorf("ReadyArtifact(%s) error = %v, want ErrArtifactNotFound", fp, err)
				}
			}
		})
	}
}

func TestClaimArtifact(t *testing.T) {
	for _, dl := range dialects {
		t.Run(dl.name, func(t *testing.T) {
			o, _, _ := dl.open(t)
			d := openDB(t, o)
			ctx := context.Background()
			for i, status := range []string{ArtifactCleanupPending, "FAILED", "ORPHANED", ArtifactReady, "BUILDING"} {
				insertArtifact(t, d, row("art-"+status, "fp"+string(rune('a'+i)), status))
			}
			for _, status := range []string{ArtifactCleanupPending, "FAILED", "ORPHANED"} {
				got, claimed, err := d.ClaimArtifact(ctx, "art-"+status)
				if err != nil || !claimed || got.Status != ArtifactDeleting || got.ObjectKey != "p/art-"+status+".ext4" {
					t.Errorf("claim of a %s row = %+v, %v, %v", status, got, claimed, err)
				}
				// A second claim (a deleter that died, a retry) succeeds too,
				// on MySQL as on PostgreSQL.
				if _, again, err := d.ClaimArtifact(ctx, "art-"+status); err != nil || !again {
					t.Errorf("second claim of %s row = %v, %v", status, again, err)
				}
			}
			for _, status := range []string{ArtifactReady, "BUILDING"} {
				got, claimed, err := d.ClaimArtifact(ctx, "art-"+status)
				if err != nil || claimed || got.Status != status {
					t.Errorf("claim of a %s row = %+v, %v, %v; want unclaimed with its status", status, got, claimed, err)
				}
			}
			if _, claimed, err := d.ClaimArtifact(ctx, "art-missing"); claimed || !errors.Is(err, ErrArtifactNotFound) {
				t.Errorf("claim of a missing row = %v, %v", claimed, err)
			}

			if err := d.ReleaseClaim(ctx, "art-FAILED", "delete object: access denied"); err != nil {
				t.Fatal(err)
			}
			got, err := d.Artifact(ctx, "art-FAILED")
			if err != nil || got.Status != ArtifactCleanupPending || got.LastError != "delete object: access denied" {
				t.Errorf("after ReleaseClaim: %+v, %v", got, err)
			}
			// Only a DELETING row is hard-deleted.
			for _, id := range []string{"art-CLEANUP_PENDING", "art-FAILED", "art-READY"} {
				if err := d.DeleteClaimed(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := d.Artifact(ctx, "art-CLEANUP_PENDING"); !errors.Is(err, ErrArtifactNotFound) {
				t.Errorf("claimed row after DeleteClaimed: %v", err)
			}
			for _, id := range []string{"art-FAILED", "art-READY"} {
				if _, err := d.Artifact(ctx, id); err != nil {
					t.Errorf("unclaimed row %s deleted: %v", id, err)
				}
			}
		})
	}
}

func TestStaleCleanups(t *testing.T) {
	for _, dl := range dialects {
		t.Run(dl.name, func(t *testing.T) {
			o, _, _ := dl.open(t)
			d := openDB(t, o)
			ctx := context.Background()
			for i, id := range []string{"old-1", "old-2", "old-3", "fresh"} {
				insertArtifact(t, d, row(id, "fp"+id, ArtifactCleanupPending))
				if id != "fresh" {
					ageArtifact(t, d, id, time.Duration(10-i)*time.Minute)
				}
			}
			insertArtifact(t, d, row("ready-old", "fpready", ArtifactReady))
			ageArtifact(t, d, "ready-old", time.Hour)
			got, err := d.StaleCleanups(ctx, 5*time.Minute, 200)
			if err != nil || len(got) != 3 || got[0] != "old-1" || got[2] != "old-3" {
				t.Errorf("StaleCleanups = %v, %v; want the three old rows, oldest first", got, err)
			}
			if got, err := d.StaleCleanups(ctx, 5*time.Minute, 2); err != nil || len(got) != 2 {
				t.Errorf("StaleCleanups with limit 2 = %v, %v", got, err)
			}
			if got, err := d.StaleCleanups(ctx, 9*time.Minute+30*time.Second, 200); err != nil || len(got) != 1 {
				t.Errorf("StaleCleanups older than 9m30s = %v, %v", got, err)
			}
		})
	}
}

// TestArtifactNullColumns: rows CubeMaster wrote with NULL text columns
// read as empty strings.
func TestArtifactNullColumns(t *testing.T) {
	for _, dl := range dialects {
		t.Run(dl.name, func(t *testing.T) {
			o, _, _ := dl.open(t)
			d := openDB(t, o)
			if _, err := d.db.Exec(d.bind("INSERT INTO t_cube_rootfs_artifact (artifact_id, template_spec_fingerprint, status) "+
				"VALUES (?, ?, ?)"), "bare", "fpbare", ArtifactReady); err != nil {
				t.Fatal(err)
			}
			got, err := d.ReadyArtifact(context.Background(), "fpbare")
			if err != nil || got.ImageConfigJSON != "" || got.StoreBacked() {
				t.Errorf("ReadyArtifact of a bare row = %+v, %v", got, err)
			}
		})
	}
}
