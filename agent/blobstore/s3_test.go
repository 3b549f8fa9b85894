package blobstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
	"github.com/cubesandbox/cubetemplatecenter/test/s3server"
)

// countingTransport counts HTTP requests, to see how often a call retried.
type countingTransport struct{ n atomic.Int64 }

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return http.DefaultTransport.RoundTrip(r)
}

// testS3Options talks to srv with small parts and fast retries.
func testS3Options(srv *s3server.Server) blobstore.S3Options {
	return blobstore.S3Options{
		Endpoint: srv.URL(), Bucket: srv.Bucket, AccessKeyID: srv.AccessKey, SecretAccessKey: srv.SecretKey,
		Region: "us-east-1", UsePathStyle: true, PartSize: blobstore.MinPartSize, Concurrency: 2,
		Attempts: 3, RetryInitial: 10 * time.Millisecond, RetryMax: 40 * time.Millisecond,
	}
}

func newS3(tb testing.TB, edit func(*blobstore.S3Options)) (*blobstore.S3, *s3server.Server) {
	tb.Helper()
	srv := s3srv.Get(tb)
	opts := testS3Options(srv)
	if edit != nil {
		edit(&opts)
	}
	s, err := blobstore.NewS3(opts)
	if err != nil {
		tb.Fatalf("NewS3: %v", err)
	}
	return s, srv
}

// openS3 is the S3 backend of the conformance suite: a store on a bucket
// of its own on the package's server, whose probe asks the server
// directly.
func openS3(tb testing.TB) *harness {
	tb.Helper()
	ctx := context.Background()
	srv := s3srv.Get(tb)
	bucket := newBucketName("conformance-")
	if err := srv.Client().MakeBucket(ctx, bucket, minio.MakeBucketOptions{}); err != nil {
		tb.Fatalf("create bucket %s: %v", bucket, err)
	}
	s, _ := newS3(tb, func(o *blobstore.S3Options) { o.Bucket = bucket })
	core := minio.Core{Client: srv.Client()}
	return &harness{
		Store: s,
		objects: func(tb testing.TB) []string {
			tb.Helper()
			var keys []string
			for obj := range core.Client.ListObjects(ctx, bucket, minio.ListObjectsOptions{Recursive: true}) {
				if obj.Err != nil {
					tb.Fatalf("list %s: %v", bucket, obj.Err)
				}
				keys = append(keys, obj.Key)
			}
			slices.Sort(keys)
			return keys
		},
		leftovers: func(tb testing.TB) []string {
			tb.Helper()
			var uploads []string
			for u := range core.Client.ListIncompleteUploads(ctx, bucket, "", true) {
				if u.Err != nil {
					tb.Fatalf("list incomplete uploads of %s: %v", bucket, u.Err)
				}
				uploads = append(uploads, u.Key+" upload "+u.UploadID)
			}
			slices.Sort(uploads)
			return uploads
		},
		interrupt: func(tb testing.TB, key string, data []byte, sum string) ([]string, func(testing.TB)) {
			tb.Helper()
			id, err := core.NewMultipartUpload(ctx, bucket, key,
				minio.PutObjectOptions{UserMetadata: map[string]string{blobstore.MetadataSHA256: sum}})
			if err != nil {
				tb.Fatal(err)
			}
			part, err := core.PutObjectPart(ctx, bucket, key, id, 1, bytes.NewReader(data), int64(len(data)), minio.PutObjectPartOptions{})
			if err != nil {
				tb.Fatal(err)
			}
			return []string{key + " upload " + id}, func(tb testing.TB) {
				tb.Helper()
				if _, err := core.CompleteMultipartUpload(ctx, bucket, key, id,
					[]minio.CompletePart{{PartNumber: 1, ETag: part.ETag}}, minio.PutObjectOptions{}); err != nil {
					tb.Fatalf("complete upload %s of %s: %v", id, key, err)
				}
			}
		},
		corrupt: func(tb testing.TB, key string) {
			tb.Helper()
			info, err := s.Stat(ctx, key)
			if err != nil {
				tb.Fatal(err)
			}
			obj, _, _, err := core.GetObject(ctx, bucket, key, minio.GetObjectOptions{})
			if err != nil {
				tb.Fatal(err)
			}
			data, err := io.ReadAll(obj)
			obj.Close()
			if err != nil || len(data) == 0 {
				tb.Fatalf("read %s to alter it: %d bytes, %v", key, len(data), err)
			}
			data[0] ^= 1
			if _, err := core.PutObject(ctx, bucket, key, bytes.NewReader(data), int64(len(data)), "", "",
				minio.PutObjectOptions{UserMetadata: map[string]string{blobstore.MetadataSHA256: info.SHA256}}); err != nil {
				tb.Fatal(err)
			}
		},
		missing: func(tb testing.TB) (blobstore.Store, string) {
			bucket := newBucketName("missing-")
			s, _ := newS3(tb, func(o *blobstore.S3Options) { o.Bucket = bucket })
			return s, bucket
		},
	}
}

// newBucketName returns a bucket name no other test uses.
func newBucketName(prefix string) string {
	return prefix + strings.ToLower(rand.Text())
}

func TestS3WrongCredentials(t *testing.T) {
	ctx := context.Background()
	const badSecret = "wrong-secret-0123456789abcdefghij"
	for name, edit := range map[string]func(*blobstore.S3Options){
		"WrongSecret":    func(o *blobstore.S3Options) { o.SecretAccessKey = badSecret },
		"UnknownKeyID":   func(o *blobstore.S3Options) { o.AccessKeyID, o.SecretAccessKey = "nobody", badSecret },
		"NoRegionLookup": func(o *blobstore.S3Options) { o.Region, o.SecretAccessKey = "", badSecret },
	} {
		t.Run(name, func(t *testing.T) {
			var rt countingTransport
			s, srv := newS3(t, func(o *blobstore.S3Options) { edit(o); o.Transport = &rt })
			data, sum := randomBytes(100, 1)
			errs := map[string]error{"Check": s.Check(ctx),
				"Put": s.Put(ctx, "denied.ext4", bytes.NewReader(data), 100, sum)}
			if name != "UnknownKeyID" {
				// versitygw answers HEAD with an unknown access key by a
				// bare 404, which no client can tell from a missing
				// object (S3 itself answers 403); Check lists instead.
				_, errs["Stat"] = s.Stat(ctx, "denied.ext4")
			}
			for op, err := range errs {
				if !errors.Is(err, blobstore.ErrAccessDenied) {
					t.Errorf("%s = %v; want ErrAccessDenied", op, err)
					continue
				}
				var e *blobstore.Error
				if !errors.As(err, &e) || e.Temporary() {
					t.Errorf("%s = %#v; want a permanent *blobstore.Error", op, err)
				}
				if msg := err.Error(); strings.Contains(msg, badSecret) || strings.Contains(msg, srv.SecretKey) {
					t.Errorf("%s error shows a secret: %s", op, msg)
				}
			}
			// Permanent errors are not retried: one request per call, plus a
			// bucket location lookup when the region is unknown.
			if n := rt.n.Load(); n > 6 {
				t.Errorf("%d requests for 3 calls that failed permanently; want no retries", n)
			}
		})
	}
}

// TestS3MissingBucket: a Put into a bucket that does not exist fails as
// such (Check's answer is in the conformance suite).
func TestS3MissingBucket(t *testing.T) {
	s, _ := newS3(t, func(o *blobstore.S3Options) { o.Bucket = "no-such-bucket" })
	data, sum := randomBytes(10, 1)
	if err := s.Put(context.Background(), "x.ext4", bytes.NewReader(data), 10, sum); !errors.Is(err, blobstore.ErrBucketMissing) {
		t.Errorf("Put = %v; want ErrBucketMissing", err)
	}
}

func TestS3Unreachable(t *testing.T) {
	ctx := context.Background()
	var rt countingTransport
	s, srv := newS3(t, func(o *blobstore.S3Options) { o.Transport = &rt })
	srv.Stop()
	t.Cleanup(func() {
		if err := srv.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
	start := time.Now()
	for op, call := range map[string]func() error{
		"Check": func() error { return s.Check(ctx) },
		"Stat":  func() error { _, err := s.Stat(ctx, "x.ext4"); return err },
	} {
		rt.n.Store(0)
		err := call()
		var e *blobstore.Error
		if !errors.Is(err, blobstore.ErrUnreachable) || !errors.As(err, &e) || !e.Temporary() {
			t.Errorf("%s with the server down = %v; want a temporary ErrUnreachable", op, err)
		}
		if n := rt.n.Load(); n != 3 {
			t.Errorf("%s sent %d requests; want 3 (Attempts)", op, n)
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("two calls against a stopped server took %s; retries are not bounded", d)
	}
}

// TestS3ServerDownMidUpload stops the server after two parts were read: the
// Put fails, its abort cannot reach the server either, and the upload stays
// behind, as after a crash. AbortIncomplete then removes it (that it
// removes nothing else is in the conformance suite).
func TestS3ServerDownMidUpload(t *testing.T) {
	ctx := context.Background()
	srv, h := s3srv.Get(t), openS3(t)
	const key = "down-mid-upload.ext4"
	size := int64(4 * blobstore.MinPartSize)
	r := newStreamReader(size, 11)
	stopped := false
	r.onRead = func(total int64) {
		if total >= 2*blobstore.MinPartSize+1 && !stopped {
			stopped = true
			srv.Stop()
		}
	}
	err := h.Put(ctx, key, r, size, streamSHA256(t, size, 11))
	if startErr := srv.Start(ctx); startErr != nil {
		t.Fatal(startErr)
	}
	if !errors.Is(err, blobstore.ErrUnreachable) {
		t.Fatalf("Put with the server going down = %v; want ErrUnreachable", err)
	}
	if len(h.leftovers(t)) == 0 {
		t.Fatal("no incomplete upload left behind; the test would not see AbortIncomplete work")
	}
	if err := h.AbortIncomplete(ctx, key, time.Now()); err != nil {
		t.Fatalf("AbortIncomplete: %v", err)
	}
	h.wantHeld(t, "after AbortIncomplete")
}

// TestS3PutMemoryBound puts 200 MiB from a reader that cannot seek, with
// 5 MiB parts two at a time, and samples the heap meanwhile: it must stay
// far below the object's size.
func TestS3PutMemoryBound(t *testing.T) {
	ctx := context.Background()
	s, _ := newS3(t, nil)
	const size = 200 << 20
	sum := streamSHA256(t, size, 9)
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
			select {
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	err := s.Put(ctx, "big.ext4", newStreamReader(size, 9), size, sum)
	close(done)
	<-sampled
	if err != nil {
		t.Fatalf("Put: %v", err)
	}
	growth := int64(peak.Load()) - int64(base.HeapInuse)
	t.Logf("heap in use grew by %d MiB for a %d MiB object (parts 5 MiB x 2)", growth>>20, size>>20)
	if growth > 64<<20 {
		t.Errorf("heap grew by %d MiB during a Put of %d MiB; want well below the object size", growth>>20, size>>20)
	}
	if info, err := s.Stat(ctx, "big.ext4"); err != nil || info.Size != size || info.SHA256 != sum {
		t.Errorf("Stat = %+v, %v", info, err)
	}
	s.Delete(ctx, "big.ext4")
}

// TestS3PartStallIsRetried puts a proxy in front of the server that takes
// the first request for part 2 and then neither reads it nor answers, as a
// connection the server stopped serving does. The part must be cancelled
// after the stall timeout and retried, and the upload complete, instead of
// waiting forever.
func TestS3PartStallIsRetried(t *testing.T) {
	srv := s3srv.Get(t)
	target, err := url.Parse(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	forward := httputil.NewSingleHostReverseProxy(target)
	var stalled atomic.Int64
	release := make(chan struct{})
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && r.URL.Query().Get("partNumber") == "2" && stalled.Add(1) == 1 {
			select {
			case <-r.Context().Done():
			case <-release:
			}
			return
		}
		forward.ServeHTTP(w, r)
	}))
	defer proxy.Close()
	defer close(release)
	opts := testS3Options(srv)
	opts.Endpoint = proxy.URL
	opts.PartStallTimeout = time.Second
	s, err := blobstore.NewS3(opts)
	if err != nil {
		t.Fatal(err)
	}
	const key = "stalled-part.ext4"
	size := int64(3 * blobstore.MinPartSize)
	// The test's own bound: far above the stall timeout, far below forever.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	if err := s.Put(ctx, key, newStreamReader(size, 21), size, streamSHA256(t, size, 21)); err != nil {
		t.Fatalf("Put through a proxy stalling part 2 = %v after %s; want the part retried and the upload done", err, time.Since(start))
	}
	if n := stalled.Load(); n < 2 {
		t.Errorf("part 2 was sent %d times; want the stalled attempt and a retry", n)
	}
	if info, err := s.Stat(context.Background(), key); err != nil || info.Size != size {
		t.Errorf("Stat after the upload = %+v, %v; want %d bytes", info, err, size)
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
