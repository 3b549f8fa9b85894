package artifacts

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
	"github.com/cubesandbox/cubetemplatecenter/spool"
)

// storedRecord records an artifact with record as its stored result in a
// new spool, beside an image file that matches it, and returns the
// artifacts over that spool and the artifact's fingerprint.
func storedRecord(t *testing.T, record []byte) (*Artifacts, string) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	sp, err := spool.Open(ctx, filepath.Join(dir, "spool.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.Close() })
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
	return New(Options{Index: sp, Logger: slog.New(slog.DiscardHandler)}), fp
}

// TestReuseReadsStoredRecord gives an artifact recorded in the
// spool by an earlier release (the record format of api's fixture) and
// requires it to reuse the artifact with every field intact.
func TestReuseReadsStoredRecord(t *testing.T) {
	record, err := os.ReadFile(filepath.Join("..", "api", "testdata", "spool", "built-v1.json"))
	if err != nil {
		t.Fatal(err)
	}
	a, fp := storedRecord(t, record)
	logger := slog.New(slog.DiscardHandler)
	_, got, ok := a.recorded(context.Background(), fp, logger)
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

// hugeCheck is a start check result as an earlier release could record
// it: a problem per PATH entry of a PATH bomb, each naming it whole, and
// thousands of libraries with long names.
func hugeCheck() *rootfs.StartCheck {
	c := &rootfs.StartCheck{Result: "failed", Command: make([]string, 5000), Resolved: strings.Repeat("/r", 5000),
		Problems: make([]string, 5000), Libraries: make(map[string]string, 5000)}
	for i := range c.Problems {
		c.Command[i] = strings.Repeat("<", 300)
		c.Problems[i] = "command \"app\" not found on PATH=" + strings.Repeat("/l:", 2000)
		c.Libraries[fmt.Sprintf("lib%d%s.so", i, strings.Repeat("<", 300))] = strings.Repeat("/<", 1000)
	}
	return c
}

// checkTemplateCheck fails unless c marshals within its bound.
func checkTemplateCheck(t *testing.T, what string, c *api.TemplateCheck) {
	t.Helper()
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if c == nil || len(b) > safetext.TemplateCheckMax || c.Result != "failed" {
		t.Errorf("%s: template_check of %d bytes, result %q; want a failed check within %d bytes", what, len(b), c.Result, safetext.TemplateCheckMax)
	}
}

// TestTemplateCheckBounded records and reads back a start check result
// larger than a template_check may be: both the BUILT fields of a new
// artifact and those of a record an earlier release wrote are bounded.
func TestTemplateCheckBounded(t *testing.T) {
	c := hugeCheck()
	old := api.Built{ArtifactID: "rfs-0123456789abcdef01234567", TemplateCheck: &api.TemplateCheck{
		Result: c.Result, Command: c.Command, Resolved: c.Resolved, Problems: c.Problems, Libraries: c.Libraries}}
	record, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	a, fp := storedRecord(t, record)
	_, got, ok := a.recorded(context.Background(), fp, slog.New(slog.DiscardHandler))
	if !ok {
		t.Fatal("recorded = false, want the recorded artifact")
	}
	checkTemplateCheck(t, "recorded", got.TemplateCheck)

	img := &rootfs.Image{Digest: "registry.test/app@sha256:" + strings.Repeat("a", 64)}
	_, built, err := a.record(context.Background(), img, nil, strings.Repeat("f", 64), &rootfs.Artifact{ID: "rfs-fffffffffffffffffffffff0",
		Path: filepath.Join(t.TempDir(), "x.ext4"), StartCheck: c})
	if err != nil {
		t.Fatalf("record: %v", err)
	}
	checkTemplateCheck(t, "record", built.TemplateCheck)
}
