package blobstore_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
)

// TestGet reads small objects back on both backends: the bytes put, a
// missing object is ErrNotFound, one over the limit ErrSizeMismatch, and
// (fs, where the test can reach the stored bytes) altered bytes
// ErrChecksumMismatch.
func TestGet(t *testing.T) {
	ctx := context.Background()
	s3, _ := newS3(t, nil)
	fsStore, root := newFS(t)
	for _, c := range []struct {
		name  string
		store blobstore.Store
	}{{"S3", s3}, {"FS", fsStore}} {
		t.Run(c.name, func(t *testing.T) {
			data, sum := randomBytes(3000, 7)
			key := "get/" + c.name + ".json"
			if err := c.store.Put(ctx, key, bytes.NewReader(data), int64(len(data)), sum); err != nil {
				t.Fatal(err)
			}
			got, err := c.store.Get(ctx, key, 4096)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("Get = %d bytes, %v; want the %d put", len(got), err, len(data))
			}
			if _, err := c.store.Get(ctx, key, 2999); !errors.Is(err, blobstore.ErrSizeMismatch) {
				t.Errorf("Get over the limit = %v, want ErrSizeMismatch", err)
			}
			if _, err := c.store.Get(ctx, "get/missing.json", 4096); !errors.Is(err, blobstore.ErrNotFound) {
				t.Errorf("Get of a missing object = %v, want ErrNotFound", err)
			}
		})
	}
	data, sum := randomBytes(100, 8)
	if err := fsStore.Put(ctx, "get/altered.json", bytes.NewReader(data), 100, sum); err != nil {
		t.Fatal(err)
	}
	data[0] ^= 1
	if err := os.WriteFile(filepath.Join(root, "get", "altered.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := fsStore.Get(ctx, "get/altered.json", 4096); !errors.Is(err, blobstore.ErrChecksumMismatch) {
		t.Errorf("Get of altered bytes = %v, want ErrChecksumMismatch", err)
	}
}

// TestS3CheckWithinDeadline: an endpoint that accepts connections but never
// answers is unreachable for a check bounded by its context, not a bare
// "context deadline exceeded".
func TestS3CheckWithinDeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s, err := blobstore.NewS3(blobstore.S3Options{Endpoint: "http://" + ln.Addr().String(), Bucket: "bucket",
		AccessKeyID: "k", SecretAccessKey: "secret-never-shown", Region: "us-east-1", UsePathStyle: true, Attempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err = s.Check(ctx)
	if !errors.Is(err, blobstore.ErrUnreachable) || strings.Contains(err.Error(), "secret-never-shown") {
		t.Errorf("Check against a silent endpoint = %v; want ErrUnreachable", err)
	}
}
