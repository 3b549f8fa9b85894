package blobstore_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
)

// TestOpenFromConfig goes from upstream's environment variables through
// agent/config to a working store on the real server.
func TestOpenFromConfig(t *testing.T) {
	ctx := context.Background()
	srv := s3srv.Get(t)
	env := map[string]string{
		"CUBE_S3_ENDPOINT": srv.URL(), "CUBE_S3_BUCKET": srv.Bucket, "CUBE_S3_ACCESS_KEY": srv.AccessKey,
		"CUBE_S3_SECRET_KEY": srv.SecretKey, "CUBE_S3_USE_PATH_STYLE": "yes", "CUBE_S3_REGION": "us-east-1",
		"CUBE_S3_ARTIFACT_PREFIX": "/templates/",
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	var logs bytes.Buffer
	cfg, err := config.Load(lookup, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	store, err := blobstore.Open(optionsFrom(cfg.ArtifactStore))
	if err != nil || store == nil {
		t.Fatalf("OpenStore = %v, %v", store, err)
	}
	if err := store.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	data, sum := randomBytes(1000, 21)
	key := blobstore.ArtifactKey(cfg.ArtifactStore.S3.Prefix, "from-config")
	if key != "templates/from-config.ext4" {
		t.Errorf("ArtifactKey = %q", key)
	}
	if err := store.Put(ctx, key, bytes.NewReader(data), 1000, sum); err != nil {
		t.Fatalf("Put: %v", err)
	}
	if info, err := store.Stat(ctx, key); err != nil || info.SHA256 != sum {
		t.Errorf("Stat = %+v, %v", info, err)
	}
	opts := optionsFrom(cfg.ArtifactStore)
	for name, out := range map[string]string{"logs": logs.String(), "%+v": fmt.Sprintf("%+v", opts),
		"%#v": fmt.Sprintf("%#v", opts), "slog": slogLine(opts.S3)} {
		if strings.Contains(out, srv.SecretKey) {
			t.Errorf("%s shows the secret: %s", name, out)
		}
	}
}

// optionsFrom is how the agent maps its configuration to the store's
// options (agent/config imports no other package of the module).
func optionsFrom(a config.ArtifactStore) blobstore.Options {
	return blobstore.Options{
		Backend: a.Enabled(),
		FSRoot:  a.FSRoot,
		S3: blobstore.S3Options{
			Endpoint: a.S3.Endpoint, Bucket: a.S3.Bucket, Region: a.S3.Region,
			AccessKeyID: a.S3.AccessKeyID, SecretAccessKey: a.S3.SecretAccessKey.Reveal(),
			UsePathStyle: a.S3.UsePathStyle, UseSSL: a.S3.UseSSL,
			PartSize: int64(a.PartSize), Concurrency: a.UploadConcurrency, Attempts: a.Attempts,
		},
	}
}

func TestOpenFromConfigNothingOrFS(t *testing.T) {
	cfg, err := config.Load(func(string) (string, bool) { return "", false }, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if s, err := blobstore.Open(optionsFrom(cfg.ArtifactStore)); s != nil || err != nil {
		t.Errorf("Open with no blob store configured = %v, %v; want nil, nil", s, err)
	}
	root := t.TempDir()
	env := map[string]string{"CUBE_ARTIFACT_STORE_BACKEND": "fs", "CUBE_ARTIFACT_STORE_FS_ROOT": root}
	cfg, err = config.Load(func(k string) (string, bool) { v, ok := env[k]; return v, ok }, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	s, err := blobstore.Open(optionsFrom(cfg.ArtifactStore))
	if f, ok := s.(*blobstore.FS); err != nil || !ok || f.Root() != root {
		t.Errorf("Open(fs from config) = %v, %v; want an fs store at %s", s, err, root)
	}
}

func slogLine(v any) string {
	var b bytes.Buffer
	slog.New(slog.NewTextHandler(&b, nil)).Info("x", "opts", v)
	return b.String()
}
