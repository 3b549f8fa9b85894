package artifacts

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// TestReuseReadsStoredRecord gives an artifact recorded in the
// spool by an earlier release (the record format of api's fixture) and
// requires it to reuse the artifact with every field intact.
func TestReuseReadsStoredRecord(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	sp, err := spool.Open(ctx, filepath.Join(dir, "spool.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Close() })
	record, err := os.ReadFile(filepath.Join("..", "api", "testdata", "spool", "built-v1.json"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "rfs-0123456789abcdef01234567.ext4")
	if err := os.WriteFile(path, []byte("image"), 0o644); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	const fp = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	if err := sp.PutArtifact(ctx, spool.Artifact{ID: "rfs-0123456789abcdef01234567", Fingerprint: fp, Path: path,
		SHA256: "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", Size: fi.Size(), ModTime: fi.ModTime(),
		Result: record}); err != nil {
		t.Fatal(err)
	}

	logger := slog.New(slog.DiscardHandler)
	a := New(Options{Index: sp, Logger: logger})
	got, ok := a.recorded(ctx, fp, logger)
	if !ok {
		t.Fatal("recorded = false, want the recorded artifact")
	}
	want := api.Built{
		ArtifactID:      "rfs-0123456789abcdef01234567",
		Fingerprint:     fp,
		SourceDigest:    "registry.test/library/nginx@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
		Ext4Path:        "/var/lib/cube-template-center/store/rfs-0123456789abcdef01234567.ext4",
		Ext4SHA256:      "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
		Ext4SizeBytes:   209715200,
		ImageConfigJSON: `{"Entrypoint":["/docker-entrypoint.sh"],"Cmd":["nginx","-g","daemon off;"],"Env":["PATH=/usr/bin"],"WorkingDir":"","User":""}`,
		MasterNodeIP:    "http://10.0.0.1:8089",
		CABaked:         true,
		CAFingerprint:   "0123456789abcdef",
		CATargets:       3,
	}
	if *got != want {
		t.Errorf("recorded:\n got %+v\nwant %+v", *got, want)
	}
}
