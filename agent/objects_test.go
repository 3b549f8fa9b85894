package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore/blobstoretest"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/test/cubemaster"
	"github.com/cubesandbox/cubetemplatecenter/test/s3server"
)

// s3srv is the package's one versitygw, started on first use.
var s3srv s3server.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	s3srv.Close()
	dbs.Close()
	os.Exit(code)
}

// s3Store opens the package's S3 server as a blob store.
func s3Store(t *testing.T, edit func(*blobstore.S3Options)) (blobstore.Store, *s3server.Server) {
	t.Helper()
	srv := s3srv.Get(t)
	return blobstoretest.S3(t, srv, edit), srv
}

// TestBuildKeepsArtifactInS3 runs builds through the agent with an S3
// blob store: BUILT carries the blob fields of a verified object, a
// reuse of a local artifact uploads only, and delete removes object and
// directory.
func TestBuildKeepsArtifactInS3(t *testing.T) {
	ctx := context.Background()
	prefix := blobstoretest.UniquePrefix(t)
	h := newHarness(t, func(c *config.Config) { c.ArtifactStore.S3.Prefix = prefix })
	// First without a blob store: the artifact is published locally only.
	h.start()
	h.submit("local", "img")
	if cb := h.terminal("local"); cb.Field("storage_backend") != "" || cb.Field("object_key") != "" {
		t.Fatalf("BUILT without a blob store has blob fields: %v", cb.Body)
	}
	h.stop()

	store, srv := s3Store(t, nil)
	h.objects = store
	h.start()
	h.submit("uploaded", "img")
	cb := h.terminal("uploaded")
	id := cb.Field("artifact_id")
	key := prefix + "/" + id + ".ext4"
	if cb.Field("status") != "BUILT" || cb.Field("storage_backend") != "s3" || cb.Field("object_key") != key || cb.Field("artifact_url") == "" {
		t.Fatalf("BUILT = %v, want the S3 blob fields for %s", cb.Body, key)
	}
	if n := h.builder.buildCount(); n != 1 {
		t.Errorf("builds = %d: the published artifact should have been uploaded, not rebuilt", n)
	}
	local, _ := os.ReadFile(cb.Field("ext4_path"))
	obj, err := srv.Client().GetObject(ctx, srv.Bucket, key, minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	remote, _ := io.ReadAll(obj)
	if len(local) == 0 || !bytes.Equal(local, remote) {
		t.Errorf("object holds %d bytes, the local image %d: want the same bytes", len(remote), len(local))
	}

	// A second job of the same spec reuses the verified object.
	h.submit("reused", "img")
	if cb := h.terminal("reused"); cb.Field("object_key") != key {
		t.Errorf("reuse = %v, want the same object", cb.Body)
	}

	for i := range 2 {
		if code, body := h.post("/tc/api/v1/artifact/delete", map[string]any{"artifact_id": id}); code != 200 {
			t.Fatalf("delete #%d = %d %v", i+1, code, body)
		}
	}
	if _, err := store.Stat(ctx, key); !errors.Is(err, blobstore.ErrNotFound) {
		t.Errorf("object after delete: %v, want ErrNotFound", err)
	}
	if _, err := os.Stat(filepath.Join(h.cfg.Store.Dir, id)); !os.IsNotExist(err) {
		t.Errorf("artifact directory after delete: %v", err)
	}
}

// TestDeleteWithObjectStoreDownKeepsLocal: when the object cannot be
// deleted, delete answers 500 and removes nothing locally.
func TestDeleteWithObjectStoreDownKeepsLocal(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	h.submit("built", "img")
	id := h.terminal("built").Field("artifact_id")
	h.stop()
	down, _ := s3Store(t, func(o *blobstore.S3Options) { o.Endpoint = "http://127.0.0.1:1" })
	h.objects = down
	h.start()
	code, body := h.post("/tc/api/v1/artifact/delete", map[string]any{"artifact_id": id})
	if code != http.StatusInternalServerError || !strings.Contains(body["error"].(string), "delete artifact object") {
		t.Errorf("delete with S3 down = %d %v, want 500 naming the object", code, body)
	}
	if _, err := os.Stat(filepath.Join(h.cfg.Store.Dir, id, id+".ext4")); err != nil {
		t.Errorf("the local artifact is gone after a failed delete: %v", err)
	}
}

// slowPut holds every Put until CubeMaster has seen three heartbeats with
// an upload's progress: a double that only delays the real store.
type slowPut struct {
	blobstore.Store
	wait func(ctx context.Context)
}

func (s slowPut) Put(ctx context.Context, key string, r io.Reader, size int64, sha string) error {
	s.wait(ctx)
	return s.Store.Put(ctx, key, r, size, sha)
}

// TestHeartbeatsDuringUpload: while the artifact uploads, the job goes on
// sending RUNNING BUILDING_EXT4 reports, with progress past the image
// build's and below 100, so CubeMaster's reaper sees a live job.
func TestHeartbeatsDuringUpload(t *testing.T) {
	store, _ := s3Store(t, nil)
	prefix := blobstoretest.UniquePrefix(t)
	h := newHarness(t, func(c *config.Config) {
		c.Build.HeartbeatInterval = 30 * time.Millisecond
		c.ArtifactStore.S3.Prefix = prefix
	})
	isUploadBeat := func(c cubemaster.Callback) bool {
		return c.JobID == "upload" && c.Field("status") == "RUNNING" && c.Field("phase") == "BUILDING_EXT4" &&
			c.Int("progress") >= api.ProgressUploadStart && c.Int("progress") < 100
	}
	h.objects = slowPut{Store: store, wait: func(ctx context.Context) { h.waitCallbacks(ctx, isUploadBeat, 3) }}
	h.start()
	h.submit("upload", "img")
	if cb := h.terminal("upload"); cb.Field("storage_backend") != "s3" {
		t.Fatalf("terminal report = %v, want BUILT in S3", cb.Body)
	}
	if beats := countCallbacks(h.master.Callbacks("upload"), isUploadBeat); beats < 3 {
		t.Errorf("got %d heartbeats during the upload, want at least 3", beats)
	}
}
