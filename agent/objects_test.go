package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
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
	opts := blobstore.S3Options{
		Endpoint: srv.URL(), Bucket: srv.Bucket, AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey,
		Region: "us-east-1", UsePathStyle: true, PartSize: blobstore.MinPartSize, Concurrency: 2,
		Attempts: 2, RetryInitial: 5 * time.Millisecond, RetryMax: 10 * time.Millisecond,
	}
	if edit != nil {
		edit(&opts)
	}
	s, err := blobstore.NewS3(opts)
	if err != nil {
		t.Fatalf("NewS3: %v", err)
	}
	return s, srv
}

// localArtifact writes an image of size bytes as a published artifact and
// returns its record.
func localArtifact(t *testing.T, id string, size int) *api.Built {
	t.Helper()
	data := bytes.Repeat([]byte(id[:8]), size/8)
	path := filepath.Join(t.TempDir(), id, id+".ext4")
	os.MkdirAll(filepath.Dir(path), 0o755)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return &api.Built{ArtifactID: id, Ext4Path: path, Ext4SHA256: hex.EncodeToString(sum[:]), Ext4SizeBytes: int64(len(data))}
}

// uniquePrefix is an object key prefix no other test, nor an earlier run
// on the same server, uses: tests build the same specs, and an object left
// by another would be reused instead of uploaded.
func uniquePrefix(t *testing.T) string {
	var b [6]byte
	rand.Read(b[:])
	return strings.ToLower(t.Name()) + "-" + hex.EncodeToString(b[:])
}

func newPublisher(store blobstore.Store, keepLocal bool) *objectPublisher {
	return &objectPublisher{store: store, prefix: "tc-test", presignTTL: time.Hour, keepLocal: keepLocal,
		recordKey: deriveRecordKey(testRecordSecret), logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		metrics: newObjectMetrics()}
}

func TestPublishToS3(t *testing.T) {
	ctx := context.Background()
	store, _ := s3Store(t, nil)
	p := newPublisher(store, true)
	built := localArtifact(t, "rfs-aaaaaaaaaaaaaaaaaaaaaaaa", 12<<20) // three parts
	var last float64
	got, err := p.ensure(ctx, built, func(f float64) { last = f })
	if err != nil {
		t.Fatal(err)
	}
	if got.StorageBackend != "s3" || got.ObjectKey != "tc-test/rfs-aaaaaaaaaaaaaaaaaaaaaaaa.ext4" || got.ArtifactURL == "" {
		t.Fatalf("blob fields = %q %q %q", got.StorageBackend, got.ObjectKey, got.ArtifactURL)
	}
	if last != 1 {
		t.Errorf("last progress = %v, want 1", last)
	}
	info, err := store.Stat(ctx, got.ObjectKey)
	if err != nil || info.Size != built.Ext4SizeBytes || info.SHA256 != built.Ext4SHA256 {
		t.Errorf("object = %+v, %v; want the image's size and sha256", info, err)
	}
	// The presigned URL downloads the same bytes over plain HTTP, as an
	// attachment named after the artifact.
	resp, err := http.Get(got.ArtifactURL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want, _ := os.ReadFile(built.Ext4Path)
	if resp.StatusCode != 200 || !bytes.Equal(body, want) {
		t.Errorf("presigned GET = %d, %d bytes; want 200 and the image", resp.StatusCode, len(body))
	}
	if cd := resp.Header.Get("Content-Disposition"); !strings.Contains(cd, `filename="rfs-aaaaaaaaaaaaaaaaaaaaaaaa.ext4"`) {
		t.Errorf("Content-Disposition = %q", cd)
	}
	if n := testutil.ToFloat64(p.metrics.uploadBytes); n != float64(built.Ext4SizeBytes) {
		t.Errorf("upload bytes = %v", n)
	}

	// Reuse: the object is found intact, nothing is uploaded again.
	again, err := p.ensure(ctx, built, nil)
	if err != nil || again.ObjectKey != got.ObjectKey || testutil.ToFloat64(p.metrics.verifiedReuses) != 1 ||
		testutil.ToFloat64(p.metrics.uploadBytes) != float64(built.Ext4SizeBytes) {
		t.Errorf("reuse = %+v, %v; verified reuses %v", again, err, testutil.ToFloat64(p.metrics.verifiedReuses))
	}
	// Deleted behind TC's back: uploaded again from the local copy.
	if err := store.Delete(ctx, got.ObjectKey); err != nil {
		t.Fatal(err)
	}
	if again, err := p.ensure(ctx, built, nil); err != nil || again.ObjectKey == "" ||
		testutil.ToFloat64(p.metrics.uploadBytes) != 2*float64(built.Ext4SizeBytes) {
		t.Errorf("after the object vanished = %+v, %v; want it uploaded again", again, err)
	}
	// Delete removes the object; deleting again is fine.
	for range 2 {
		if err := p.remove(ctx, built.ArtifactID, ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.Stat(ctx, got.ObjectKey); !errors.Is(err, blobstore.ErrNotFound) {
		t.Errorf("Stat after remove = %v, want ErrNotFound", err)
	}
}

func TestPublishWithoutLocalCopy(t *testing.T) {
	ctx := context.Background()
	store, _ := s3Store(t, nil)
	p := newPublisher(store, false)
	built := localArtifact(t, "rfs-bbbbbbbbbbbbbbbbbbbbbbbb", 1<<20)
	got, err := p.ensure(ctx, built, nil)
	if err != nil || got.ObjectKey == "" {
		t.Fatalf("ensure = %+v, %v", got, err)
	}
	if _, err := os.Stat(built.Ext4Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("local copy kept after a verified upload with keep_local off: %v", err)
	}
	// Reuse relies on the object alone.
	if again, err := p.ensure(ctx, built, nil); err != nil || again.ObjectKey != got.ObjectKey {
		t.Errorf("reuse from the object alone = %+v, %v", again, err)
	}
	// With neither object nor local copy, the artifact must be rebuilt.
	store.Delete(ctx, got.ObjectKey)
	if _, err := p.ensure(ctx, built, nil); !errors.Is(err, errObjectMissing) {
		t.Errorf("ensure with nothing left = %v, want errObjectMissing", err)
	}
}

func TestPublishS3DownFallsBack(t *testing.T) {
	ctx := context.Background()
	store, _ := s3Store(t, func(o *blobstore.S3Options) { o.Endpoint = "http://127.0.0.1:1" })
	p := newPublisher(store, true)
	built := localArtifact(t, "rfs-cccccccccccccccccccccccc", 1<<20)
	got, err := p.ensure(ctx, built, nil)
	if err != nil || got.StorageBackend != "" || got.ObjectKey != "" || got.ArtifactURL != "" {
		t.Fatalf("ensure with S3 down = %+v, %v; want the local artifact without blob fields", got, err)
	}
	if testutil.ToFloat64(p.metrics.fallbacks) != 1 {
		t.Errorf("fallbacks = %v, want 1", testutil.ToFloat64(p.metrics.fallbacks))
	}
	if got.Ext4Path != built.Ext4Path || got.Ext4SHA256 != built.Ext4SHA256 {
		t.Errorf("fallback lost the local fields: %+v", got)
	}
}

func TestPublishWrongCredentialsFallsBack(t *testing.T) {
	store, srv := s3Store(t, func(o *blobstore.S3Options) { o.SecretAccessKey = "wrong-secret-for-the-test" })
	p := newPublisher(store, true)
	built := localArtifact(t, "rfs-dddddddddddddddddddddddd", 1<<20)
	got, err := p.ensure(context.Background(), built, nil)
	if err != nil || got.ObjectKey != "" {
		t.Fatalf("ensure with wrong credentials = %+v, %v; want the fallback", got, err)
	}
	if testutil.ToFloat64(p.metrics.fallbacks) != 1 {
		t.Errorf("fallbacks = %v, want 1", testutil.ToFloat64(p.metrics.fallbacks))
	}
	if _, err := srv.Client().StatObject(context.Background(), srv.Bucket, "tc-test/"+built.ArtifactID+".ext4", minio.StatObjectOptions{}); err == nil {
		t.Error("an object was stored with wrong credentials")
	}
}

func TestPublishToFS(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	store, err := blobstore.NewFS(root)
	if err != nil {
		t.Fatal(err)
	}
	p := newPublisher(store, true)
	built := localArtifact(t, "rfs-eeeeeeeeeeeeeeeeeeeeeeee", 1<<20)
	got, err := p.ensure(ctx, built, nil)
	if err != nil || got.StorageBackend != "fs" || got.ObjectKey != "tc-test/rfs-eeeeeeeeeeeeeeeeeeeeeeee.ext4" || got.ArtifactURL != "" {
		t.Fatalf("ensure on fs = %+v, %v", got, err)
	}
	data, err := os.ReadFile(filepath.Join(root, got.ObjectKey))
	want, _ := os.ReadFile(built.Ext4Path)
	if err != nil || !bytes.Equal(data, want) {
		t.Errorf("fs object = %d bytes, %v; want the image", len(data), err)
	}
	// A failing fs store fails the job instead of falling back: its root
	// is now a file.
	os.RemoveAll(root)
	os.WriteFile(root, []byte("not a directory"), 0o644)
	other := localArtifact(t, "rfs-ffffffffffffffffffffffff", 1<<20)
	if _, err := p.ensure(ctx, other, nil); err == nil {
		t.Error("ensure on a vanished fs root succeeded; want an error (fs never falls back)")
	}
}

// TestBuildKeepsArtifactInS3 runs builds through the agent with an S3
// blob store: BUILT carries the blob fields of a verified object, a
// reuse of a local artifact uploads only, and delete removes object and
// directory.
func TestBuildKeepsArtifactInS3(t *testing.T) {
	ctx := context.Background()
	prefix := uniquePrefix(t)
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
	prefix := uniquePrefix(t)
	h := newHarness(t, func(c *config.Config) {
		c.Build.HeartbeatInterval = 30 * time.Millisecond
		c.ArtifactStore.S3.Prefix = prefix
	})
	isUploadBeat := func(c cubemaster.Callback) bool {
		return c.JobID == "upload" && c.Field("status") == "RUNNING" && c.Field("phase") == "BUILDING_EXT4" &&
			c.Int("progress") >= progressUploadStart && c.Int("progress") < 100
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

// TestRemoveOnlyOwnKey: remove deletes the object and record under the
// artifact's own key, and nothing under another key a row names, which
// may be anything in the bucket: another artifact's object, or a file of
// the store under an fs root that is the store.
func TestRemoveOnlyOwnKey(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	store, err := blobstore.NewFS(root)
	if err != nil {
		t.Fatal(err)
	}
	p := newPublisher(store, true)
	id := "rfs-bbbbbbbbbbbbbbbbbbbbbbbb"
	own := blobstore.ArtifactKey(p.prefix, id)
	put := func(keys ...string) {
		for _, obj := range keys {
			sum := sha256.Sum256([]byte(obj))
			if err := store.Put(ctx, obj, strings.NewReader(obj), int64(len(obj)), hex.EncodeToString(sum[:])); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, rowKey := range []string{"rfs-cccccccccccccccccccccccc/rfs-cccccccccccccccccccccccc.ext4",
		"elsewhere/" + id + ".ext4", blobstore.ArtifactKey(p.prefix, "rfs-dddddddddddddddddddddddd")} {
		put(own, recordKey(own), rowKey, recordKey(rowKey))
		if err := p.remove(ctx, id, rowKey); err != nil {
			t.Fatal(err)
		}
		for _, obj := range []string{own, recordKey(own)} {
			if _, err := store.Stat(ctx, obj); !errors.Is(err, blobstore.ErrNotFound) {
				t.Errorf("%s after remove: %v", obj, err)
			}
		}
		for _, obj := range []string{rowKey, recordKey(rowKey)} {
			if _, err := store.Stat(ctx, obj); err != nil {
				t.Errorf("remove with a row naming %s deleted %s: %v", rowKey, obj, err)
			}
		}
	}
	if n := testutil.ToFloat64(p.metrics.failures.WithLabelValues("foreign_key")); n != 3 {
		t.Errorf("foreign keys counted = %v, want 3", n)
	}
	if err := p.remove(ctx, id, own); err != nil {
		t.Errorf("remove with the row naming the own key: %v", err)
	}
}

// pausedReader blocks once after the first part's bytes were read, until
// release closes, telling paused that it got there.
type pausedReader struct {
	io.Reader
	n, after int64
	paused   chan<- struct{}
	release  <-chan struct{}
}

func (r *pausedReader) Read(b []byte) (int, error) {
	if r.n >= r.after && r.paused != nil {
		close(r.paused)
		r.paused = nil
		<-r.release
	}
	n, err := r.Reader.Read(b)
	r.n += int64(n)
	return n, err
}

// pausingPut pauses a Put (see pausedReader) once its upload is under way.
type pausingPut struct {
	blobstore.Store
	paused  chan<- struct{}
	release <-chan struct{}
}

func (s pausingPut) Put(ctx context.Context, key string, r io.Reader, size int64, sha string) error {
	return s.Store.Put(ctx, key, &pausedReader{Reader: r, after: blobstore.MinPartSize + 1, paused: s.paused, release: s.release}, size, sha)
}

func (s pausingPut) PutFile(ctx context.Context, key, path string, size int64, sha string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return s.Put(ctx, key, f, size, sha)
}

// TestTwoUploadersOfOneKey: two replicas upload the same artifact at once
// (the build lock lost, the database unreachable, or a re-upload of a
// local copy). The second must not abort the first's upload: both end with
// blob fields, and the bucket keeps one object and no incomplete upload.
func TestTwoUploadersOfOneKey(t *testing.T) {
	for _, backend := range []string{blobstore.BackendS3, blobstore.BackendFS} {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			var store blobstore.Store
			var srv *s3server.Server
			prefix := uniquePrefix(t)
			if backend == blobstore.BackendS3 {
				store, srv = s3Store(t, nil)
			} else {
				fs, err := blobstore.NewFS(t.TempDir())
				if err != nil {
					t.Fatal(err)
				}
				store = fs
			}
			paused, release := make(chan struct{}), make(chan struct{})
			first, second := newPublisher(pausingPut{Store: store, paused: paused, release: release}, true), newPublisher(store, true)
			for _, p := range []*objectPublisher{first, second} {
				p.prefix = prefix
				p.abandonAfter = func() time.Duration { return time.Hour }
			}
			built := localArtifact(t, "rfs-eeeeeeeeeeeeeeeeeeeeeeee", 12<<20) // three parts
			key := blobstore.ArtifactKey(prefix, built.ArtifactID)

			type result struct {
				built *api.Built
				err   error
			}
			firstDone := make(chan result, 1)
			go func() {
				b, err := first.ensure(ctx, built, nil)
				firstDone <- result{b, err}
			}()
			<-paused
			out, err := second.ensure(ctx, built, nil)
			if err != nil || out.ObjectKey != key {
				t.Fatalf("second uploader: %+v, %v; want object %s", out, err, key)
			}
			close(release)
			r := <-firstDone
			if r.err != nil || r.built.ObjectKey != key || r.built.StorageBackend != backend {
				t.Fatalf("first uploader after the second finished: %+v, %v; want object %s (its upload was aborted?)", r.built, r.err, key)
			}
			if n := testutil.ToFloat64(first.metrics.fallbacks) + testutil.ToFloat64(second.metrics.fallbacks); n != 0 {
				t.Errorf("fallbacks to the local artifact = %v, want 0", n)
			}
			info, err := store.Stat(ctx, key)
			if err != nil || info.SHA256 != built.Ext4SHA256 {
				t.Errorf("object after both uploads: %+v, %v", info, err)
			}
			if srv != nil {
				core := minio.Core{Client: srv.Client()}
				res, err := core.ListMultipartUploads(ctx, srv.Bucket, key, "", "", "", 1000)
				if err != nil {
					t.Fatal(err)
				}
				if len(res.Uploads) != 0 {
					t.Errorf("incomplete uploads left: %v", res.Uploads)
				}
			}
		})
	}
}
