// Package blobstoretest opens the test S3 server as a blob store, for the
// tests of the packages that publish artifacts.
package blobstoretest

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
	"github.com/cubesandbox/cubetemplatecenter/test/s3server"
)

// S3 opens srv's bucket as a blob store with small parts and quick
// retries; edit adjusts the options first.
func S3(tb testing.TB, srv *s3server.Server, edit func(*blobstore.S3Options)) blobstore.Store {
	tb.Helper()
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
		tb.Fatalf("NewS3: %v", err)
	}
	return s
}

// UniquePrefix is an object key prefix no other test, nor an earlier run
// on the same server, uses: tests build the same specs, and an object left
// by another would be reused instead of uploaded.
func UniquePrefix(tb testing.TB) string {
	var b [6]byte
	rand.Read(b[:])
	return strings.ToLower(tb.Name()) + "-" + hex.EncodeToString(b[:])
}
