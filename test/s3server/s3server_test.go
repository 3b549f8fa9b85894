package s3server

import (
	"bytes"
	"context"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"
)

var shared Shared

func TestMain(m *testing.M) {
	code := m.Run()
	shared.Close()
	os.Exit(code)
}

func TestServeStopStart(t *testing.T) {
	ctx := context.Background()
	s := shared.Get(t)
	if again := shared.Get(t); again != s {
		t.Fatal("Shared.Get started a second server")
	}
	c := s.Client()
	if ok, err := c.BucketExists(ctx, s.Bucket); err != nil || !ok {
		t.Fatalf("BucketExists(%s) = %v, %v; want true", s.Bucket, ok, err)
	}
	body := []byte("hello")
	if _, err := c.PutObject(ctx, s.Bucket, "k", bytes.NewReader(body), int64(len(body)), minio.PutObjectOptions{}); err != nil {
		t.Fatalf("PutObject: %v", err)
	}
	s.Stop()
	if _, err := c.BucketExists(ctx, s.Bucket); err == nil {
		t.Fatal("BucketExists succeeded against a stopped server")
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	obj, err := c.GetObject(ctx, s.Bucket, "k", minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(obj)
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("object after restart = %q, %v; want %q", got, err, body)
	}
}

func TestMissingBinaryNamesMakeTools(t *testing.T) {
	t.Setenv(BinaryEnv, "/nonexistent/versitygw")
	_, err := Binary()
	if err == nil || !strings.Contains(err.Error(), "make tools") {
		t.Fatalf("Binary() error = %v; want one that says to run make tools", err)
	}
}
