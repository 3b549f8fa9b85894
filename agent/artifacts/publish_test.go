package artifacts

import (
	"bytes"
	"context"
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

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore/blobstoretest"
	"github.com/cubesandbox/cubetemplatecenter/test/s3server"
	"github.com/minio/minio-go/v7"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

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

func newPublisher(store blobstore.Store, keepLocal bool) *publisher {
	return &publisher{blobs: store, prefix: "tc-test", presignTTL: time.Hour, keepLocal: keepLocal,
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
	if _, err := p.ensure(ctx, built, nil); !errors.Is(err, ErrObjectMissing) {
		t.Errorf("ensure with nothing left = %v, want ErrObjectMissing", err)
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
		put(own, recordObjectKey(own), rowKey, recordObjectKey(rowKey))
		if err := p.remove(ctx, id, rowKey); err != nil {
			t.Fatal(err)
		}
		for _, obj := range []string{own, recordObjectKey(own)} {
			if _, err := store.Stat(ctx, obj); !errors.Is(err, blobstore.ErrNotFound) {
				t.Errorf("%s after remove: %v", obj, err)
			}
		}
		for _, obj := range []string{rowKey, recordObjectKey(rowKey)} {
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
			prefix := blobstoretest.UniquePrefix(t)
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
			for _, p := range []*publisher{first, second} {
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
