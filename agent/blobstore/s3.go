package blobstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Part size limits of the S3 backend.
const (
	// MinPartSize is S3's smallest part (all but the last).
	MinPartSize = 5 << 20
	// DefaultPartSize is the part size when none is set.
	DefaultPartSize = 16 << 20
	// DefaultConcurrency is how many parts upload at once when unset.
	DefaultConcurrency = 4
	// maxParts is S3's limit on parts per upload; larger objects get
	// larger parts.
	maxParts = 10000
	// maxPartSize is S3's largest part.
	maxPartSize = 5 << 30
	// abortTimeout bounds the cleanup of a failed multipart upload, which
	// runs even when the caller's ctx is done.
	abortTimeout = 30 * time.Second
	// DefaultPartStallTimeout is how long a part upload may make no
	// progress (no body read, or no answer after the last byte) before
	// it is cancelled and retried.
	DefaultPartStallTimeout = 2 * time.Minute
)

// S3Options configure the S3 backend. Zero values take the Default* constants.
type S3Options struct {
	// Endpoint is host:port (TLS per UseSSL) or an http:// or https://
	// URL, whose scheme decides TLS.
	Endpoint string
	// Bucket holds the objects; it must exist.
	Bucket string
	// AccessKeyID and SecretAccessKey are static credentials, with
	// SessionToken when STS issued them.
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string
	// Credentials, when set and the static keys are not, sign requests
	// instead (AWSCredentialChain).
	Credentials *CredentialChain
	// Region is the bucket's region; empty asks the server.
	Region string
	// UsePathStyle addresses the bucket as endpoint/bucket instead of
	// bucket.endpoint (needed by most MinIO setups; automatic otherwise).
	UsePathStyle bool
	// UseSSL selects TLS when Endpoint has no scheme.
	UseSSL bool
	// PartSize is the multipart part size, at least MinPartSize. Put holds
	// at most PartSize × Concurrency bytes in memory.
	PartSize int64
	// Concurrency is how many parts upload at once.
	Concurrency int
	// Attempts bounds tries per request for transient failures.
	Attempts int
	// RetryInitial and RetryMax shape the exponential backoff.
	RetryInitial, RetryMax time.Duration
	// PartStallTimeout cancels a part upload (or a single PUT) that makes
	// no progress this long, so that a connection the server stopped
	// serving is retried instead of holding the upload forever.
	PartStallTimeout time.Duration
	// Transport replaces the HTTP transport (custom CAs, tests).
	Transport http.RoundTripper
}

// String prints the options with the secret redacted.
func (o S3Options) String() string {
	type plain S3Options // no methods: no recursion
	if o.SecretAccessKey != "" {
		o.SecretAccessKey = "REDACTED"
	}
	if o.SessionToken != "" {
		o.SessionToken = "REDACTED"
	}
	return fmt.Sprintf("%+v", plain(o))
}

// GoString is String, for %#v.
func (o S3Options) GoString() string { return o.String() }

// LogValue is String, for slog.
func (o S3Options) LogValue() slog.Value { return slog.StringValue(o.String()) }

// S3 stores objects in an S3 bucket.
type S3 struct {
	core        minio.Core
	bucket      string
	secret      string
	chain       *CredentialChain
	partSize    int64
	concurrency int
	retry       retryPolicy
	stall       time.Duration
}

var _ Store = (*S3)(nil)

// NewS3 returns an S3 backend. It does no I/O: Check tells whether the
// bucket answers.
func NewS3(opts S3Options) (*S3, error) {
	host, secure, err := parseEndpoint(opts.Endpoint, opts.UseSSL)
	if err != nil {
		return nil, fmt.Errorf("s3 endpoint: %w", err)
	}
	if opts.Bucket == "" {
		return nil, errors.New("s3: bucket is required")
	}
	var creds *credentials.Credentials
	switch {
	case opts.AccessKeyID != "" && opts.SecretAccessKey != "":
		creds = credentials.NewStaticV4(opts.AccessKeyID, opts.SecretAccessKey, opts.SessionToken)
		opts.Credentials = nil
	case opts.AccessKeyID != "" || opts.SecretAccessKey != "":
		return nil, errors.New("s3: access key id and secret access key go together")
	case opts.Credentials != nil:
		creds = opts.Credentials.Credentials()
	default:
		return nil, errors.New("s3: static keys or a credential chain are required")
	}
	if opts.PartSize == 0 {
		opts.PartSize = DefaultPartSize
	}
	if opts.PartSize < MinPartSize || opts.PartSize > maxPartSize {
		return nil, fmt.Errorf("s3: part size %d is outside %d..%d", opts.PartSize, MinPartSize, maxPartSize)
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.Attempts <= 0 {
		opts.Attempts = DefaultAttempts
	}
	if opts.RetryInitial <= 0 {
		opts.RetryInitial = DefaultRetryInitial
	}
	if opts.RetryMax < opts.RetryInitial {
		opts.RetryMax = max(DefaultRetryMax, opts.RetryInitial)
	}
	if opts.PartStallTimeout <= 0 {
		opts.PartStallTimeout = DefaultPartStallTimeout
	}
	lookup := minio.BucketLookupAuto
	if opts.UsePathStyle {
		lookup = minio.BucketLookupPath
	}
	client, err := minio.New(host, &minio.Options{
		Creds:        creds,
		Secure:       secure,
		Region:       opts.Region,
		BucketLookup: lookup,
		Transport:    opts.Transport,
		MaxRetries:   1, // retries are ours, classified and bounded by Attempts
	})
	if err != nil {
		return nil, fmt.Errorf("s3 client: %s", scrub(err.Error(), opts.SecretAccessKey))
	}
	return &S3{core: minio.Core{Client: client}, bucket: opts.Bucket, secret: opts.SecretAccessKey, chain: opts.Credentials,
		partSize: opts.PartSize, concurrency: opts.Concurrency, stall: opts.PartStallTimeout,
		retry: retryPolicy{attempts: opts.Attempts, initial: opts.RetryInitial, max: opts.RetryMax}}, nil
}

// parseEndpoint splits an endpoint into host:port and whether to use TLS.
func parseEndpoint(endpoint string, useSSL bool) (string, bool, error) {
	if endpoint == "" {
		return "", false, errors.New("empty")
	}
	if !strings.Contains(endpoint, "://") {
		if strings.ContainsAny(endpoint, "/?#") {
			return "", false, fmt.Errorf("%q is neither host:port nor an http(s) URL", endpoint)
		}
		return endpoint, useSSL, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
		return "", false, fmt.Errorf("%q is not an http(s) URL without path", endpoint)
	}
	switch u.Scheme {
	case "http":
		return u.Host, false, nil
	case "https":
		return u.Host, true, nil
	}
	return "", false, fmt.Errorf("%q: scheme %q is not http or https", endpoint, u.Scheme)
}

// CredentialsSource names where the keys signing requests come from
// (CredentialsStatic, or the chain's source in use), never the keys.
func (s *S3) CredentialsSource() string {
	if s.chain == nil {
		return CredentialsStatic
	}
	return s.chain.Source()
}

// Backend returns BackendS3.
func (s *S3) Backend() string { return BackendS3 }

// Abilities implements Store: objects are presigned, and a failed upload
// falls back to the local artifact.
func (s *S3) Abilities() Abilities { return Abilities{Presign: true, LocalFallback: true} }

// fail turns a client error into an *Error with its text scrubbed.
func (s *S3) fail(op, key string, err error) error {
	if err == nil {
		return nil
	}
	var already *Error
	if errors.As(err, &already) {
		return err
	}
	c := classify(err)
	e := &Error{Backend: BackendS3, Op: op, Key: key, Kind: c.kind, Code: c.code, StatusCode: c.status,
		temporary: c.temporary, cause: c.contextErr}
	// Our own argument and content checks carry sentinels worth keeping.
	for _, sentinel := range []error{ErrInvalidKey, ErrChecksumMismatch, ErrSizeMismatch} {
		if errors.Is(err, sentinel) {
			e.cause = sentinel
		}
	}
	var resp minio.ErrorResponse
	if errors.As(err, &resp) && resp.Message != "" {
		e.Detail = scrub(resp.Message, s.secret)
	} else {
		e.Detail = scrub(err.Error(), s.secret)
	}
	return e
}

// putOptions carries the sha256 in user metadata.
func putOptions(sha256hex string) minio.PutObjectOptions {
	return minio.PutObjectOptions{
		UserMetadata: map[string]string{MetadataSHA256: strings.ToLower(sha256hex)},
		ContentType:  "application/octet-stream",
	}
}

// Put streams r to key: one PUT for objects up to the part size, otherwise
// a multipart upload holding at most part size × concurrency bytes. A
// failed multipart upload is aborted, even when ctx is done.
func (s *S3) Put(ctx context.Context, key string, r io.Reader, size int64, sha256hex string) error {
	if err := checkPut(key, size, sha256hex); err != nil {
		return s.fail("put", key, err)
	}
	v := newVerifier(r, size, sha256hex)
	partSize := s.partSize
	if size > partSize*maxParts {
		partSize = min((size+maxParts-1)/maxParts, maxPartSize)
	}
	if size <= partSize {
		return s.fail("put", key, s.putSingle(ctx, key, v, size, sha256hex))
	}
	return s.fail("put", key, s.putMultipart(ctx, key, v, size, partSize, sha256hex))
}

func (s *S3) putSingle(ctx context.Context, key string, v *verifier, size int64, sha256hex string) error {
	buf := make([]byte, size)
	if err := v.fill(buf); err != nil {
		return err
	}
	if err := v.finish(); err != nil {
		return err
	}
	return s.retry.do(ctx, func(ctx context.Context) error {
		ctx, body, stop := s.guardStall(ctx, buf)
		_, err := s.core.PutObject(ctx, s.bucket, key, body, size, "", "", putOptions(sha256hex))
		return stop(err)
	})
}

func (s *S3) putMultipart(ctx context.Context, key string, v *verifier, size, partSize int64, sha256hex string) (err error) {
	var uploadID string
	if err := s.retry.do(ctx, func(ctx context.Context) error {
		var err error
		uploadID, err = s.core.NewMultipartUpload(ctx, s.bucket, key, putOptions(sha256hex))
		return err
	}); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			s.abortUpload(ctx, key, uploadID)
		}
	}()

	nparts := int((size + partSize - 1) / partSize)
	parts := make([]minio.CompletePart, nparts)
	uctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// free holds the part buffers: the reader fills one only when an
	// upload has returned it, which bounds memory.
	workers := min(s.concurrency, nparts)
	free := make(chan []byte, workers)
	for range workers {
		free <- make([]byte, partSize)
	}
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	setErr := func(err error) {
		errOnce.Do(func() { firstErr = err; cancel() })
	}
	for i := range nparts {
		var buf []byte
		select {
		case buf = <-free:
		case <-uctx.Done():
		}
		if buf == nil {
			break
		}
		n := min(partSize, size-int64(i)*partSize)
		if err := v.fill(buf[:n]); err != nil {
			// A bad source cancels nothing: parts in flight finish, so the
			// abort below does not race the server still storing them.
			errOnce.Do(func() { firstErr = err })
			break
		}
		wg.Add(1)
		go func(num int, data []byte) {
			defer wg.Done()
			defer func() { free <- buf }()
			err := s.retry.do(uctx, func(ctx context.Context) error {
				ctx, body, stop := s.guardStall(ctx, data)
				p, err := s.core.PutObjectPart(ctx, s.bucket, key, uploadID, num, body,
					int64(len(data)), minio.PutObjectPartOptions{})
				parts[num-1] = minio.CompletePart{PartNumber: num, ETag: p.ETag}
				return stop(err)
			})
			if err != nil {
				setErr(err)
			}
		}(i+1, buf[:n])
	}
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	if firstErr != nil {
		return firstErr
	}
	if err := v.finish(); err != nil {
		return err
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i].PartNumber < parts[j].PartNumber })
	return s.retry.do(ctx, func(ctx context.Context) error {
		_, err := s.core.CompleteMultipartUpload(ctx, s.bucket, key, uploadID, parts, putOptions(sha256hex))
		return err
	})
}

// errStalled marks a request cancelled for making no progress; classify
// treats it as temporary, so the attempt is retried.
var errStalled = errors.New("no progress")

// guardStall returns a ctx for one request sending data, the body to send,
// and stop, which ends the guard and turns the request's error into a
// stall error when the guard cancelled it. The guard cancels ctx once the
// body has not been read for s.stall: the server stopped taking data, or,
// after the last byte, stopped answering.
func (s *S3) guardStall(ctx context.Context, data []byte) (context.Context, io.Reader, func(error) error) {
	ctx, cancel := context.WithCancelCause(ctx)
	timer := time.AfterFunc(s.stall, func() { cancel(errStalled) })
	body := &stallReader{Reader: bytes.NewReader(data), timer: timer, stall: s.stall}
	return ctx, body, func(err error) error {
		timer.Stop()
		stalled := errors.Is(context.Cause(ctx), errStalled)
		cancel(nil)
		if err != nil && stalled {
			return fmt.Errorf("request made no progress for %s: %w", s.stall, errStalled)
		}
		return err
	}
}

// stallReader re-arms its timer on every read. It keeps bytes.Reader's
// Seek, so the client can still rewind the body.
type stallReader struct {
	*bytes.Reader
	timer *time.Timer
	stall time.Duration
}

func (r *stallReader) Read(p []byte) (int, error) {
	r.timer.Reset(r.stall)
	return r.Reader.Read(p)
}

// abortUpload aborts a failed multipart upload, even when ctx is done. S3
// may keep parts that were still arriving at the time of an abort, so the
// abort repeats while the upload is still listed.
func (s *S3) abortUpload(ctx context.Context, key, uploadID string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
	defer cancel()
	for i := range 3 {
		if i > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(i) * 100 * time.Millisecond):
			}
		}
		err := s.retry.do(ctx, func(ctx context.Context) error {
			return s.core.AbortMultipartUpload(ctx, s.bucket, key, uploadID)
		})
		if err != nil && classify(err).code != "NoSuchUpload" {
			return // unreachable or denied: AbortIncomplete cleans up later
		}
		uploads, err := s.incompleteUploads(ctx, key)
		if err != nil || !slices.ContainsFunc(uploads, func(u minio.ObjectMultipartInfo) bool { return u.UploadID == uploadID }) {
			return
		}
	}
}

// PutFile streams the file at path to key.
func (s *S3) PutFile(ctx context.Context, key, path string, size int64, sha256hex string) error {
	f, err := os.Open(path)
	if err != nil {
		return sourceFailed(BackendS3, key, err)
	}
	defer f.Close()
	return s.Put(ctx, key, f, size, sha256hex)
}

// Stat reads the object's size and sha256 metadata.
func (s *S3) Stat(ctx context.Context, key string) (Info, error) {
	if err := checkKey(key); err != nil {
		return Info{}, s.fail("stat", key, err)
	}
	var oi minio.ObjectInfo
	err := s.retry.do(ctx, func(ctx context.Context) error {
		var err error
		oi, err = s.core.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{})
		return err
	})
	if err != nil {
		return Info{}, s.fail("stat", key, err)
	}
	info := Info{Key: key, Size: oi.Size, ModTime: oi.LastModified, ETag: oi.ETag}
	for k, v := range oi.UserMetadata {
		if strings.EqualFold(k, MetadataSHA256) || strings.EqualFold(k, "X-Amz-Meta-"+MetadataSHA256) {
			info.SHA256 = strings.ToLower(v)
		}
	}
	return info, nil
}

// Get reads a small object whole, checked against its sha256 metadata.
func (s *S3) Get(ctx context.Context, key string, maxBytes int64) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return nil, s.fail("get", key, err)
	}
	var data []byte
	err := s.retry.do(ctx, func(ctx context.Context) error {
		body, oi, _, err := s.core.GetObject(ctx, s.bucket, key, minio.GetObjectOptions{})
		if err != nil {
			return err
		}
		defer body.Close()
		if oi.Size > maxBytes {
			return fmt.Errorf("object is %d bytes, more than %d: %w", oi.Size, maxBytes, ErrSizeMismatch)
		}
		sum := ""
		for k, v := range oi.Metadata {
			if strings.EqualFold(k, "X-Amz-Meta-"+MetadataSHA256) && len(v) > 0 {
				sum = v[0]
			}
		}
		data, err = getChecked(body, maxBytes, sum)
		return err
	})
	if err != nil {
		return nil, s.fail("get", key, err)
	}
	return data, nil
}

// Delete removes the object; S3 answers success for a missing key too.
func (s *S3) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return s.fail("delete", key, err)
	}
	err := s.retry.do(ctx, func(ctx context.Context) error {
		return s.core.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{})
	})
	if err != nil && classify(err).kind == ErrNotFound {
		return nil
	}
	return s.fail("delete", key, err)
}

// PresignGet signs a GET valid for ttl (at most MaxPresignTTL) whose
// response carries Content-Disposition: attachment; filename="<base name>".
func (s *S3) PresignGet(ctx context.Context, key string, ttl time.Duration) (string, error) {
	if err := checkKey(key); err != nil {
		return "", s.fail("presign", key, err)
	}
	if err := checkTTL(ttl); err != nil {
		return "", s.fail("presign", key, err)
	}
	params := url.Values{}
	params.Set("response-content-disposition", fmt.Sprintf("attachment; filename=%q", path.Base(key)))
	var u *url.URL
	err := s.retry.do(ctx, func(ctx context.Context) error {
		var err error
		u, err = s.core.PresignedGetObject(ctx, s.bucket, key, ttl, params)
		return err
	})
	if err != nil {
		return "", s.fail("presign", key, err)
	}
	return u.String(), nil
}

// AbortIncomplete aborts the incomplete multipart uploads of exactly key
// that were initiated before startedBefore.
func (s *S3) AbortIncomplete(ctx context.Context, key string, startedBefore time.Time) error {
	if err := checkKey(key); err != nil {
		return s.fail("abort", key, err)
	}
	uploads, err := s.incompleteUploads(ctx, key)
	if err != nil {
		return s.fail("abort", key, err)
	}
	for _, u := range uploads {
		if !u.Initiated.Before(startedBefore) {
			continue
		}
		err := s.retry.do(ctx, func(ctx context.Context) error {
			return s.core.AbortMultipartUpload(ctx, s.bucket, key, u.UploadID)
		})
		if err != nil && classify(err).code != "NoSuchUpload" {
			return s.fail("abort", key, err)
		}
	}
	return nil
}

// incompleteUploads lists key's incomplete uploads.
func (s *S3) incompleteUploads(ctx context.Context, key string) ([]minio.ObjectMultipartInfo, error) {
	var uploads []minio.ObjectMultipartInfo
	keyMarker, idMarker := "", ""
	for {
		var res minio.ListMultipartUploadsResult
		err := s.retry.do(ctx, func(ctx context.Context) error {
			var err error
			res, err = s.core.ListMultipartUploads(ctx, s.bucket, key, keyMarker, idMarker, "", 1000)
			return err
		})
		if err != nil {
			return nil, err
		}
		for _, u := range res.Uploads {
			if u.Key == key { // the listing is by prefix
				uploads = append(uploads, u)
			}
		}
		if !res.IsTruncated || (res.NextKeyMarker == keyMarker && res.NextUploadIDMarker == idMarker) {
			return uploads, nil
		}
		keyMarker, idMarker = res.NextKeyMarker, res.NextUploadIDMarker
	}
}

// Check lists at most one object of the bucket, with the usual retries. A
// listing rather than HEAD bucket: its error body tells a missing bucket
// from unknown credentials, which some servers both answer 404 to on HEAD.
func (s *S3) Check(ctx context.Context) error {
	err := s.retry.do(ctx, func(ctx context.Context) error {
		lctx, cancel := context.WithCancel(ctx)
		defer cancel() // ends the listing goroutine after the first answer
		for obj := range s.core.Client.ListObjects(lctx, s.bucket, minio.ListObjectsOptions{MaxKeys: 1}) {
			return obj.Err
		}
		return nil
	})
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// No answer within the caller's bound (a health probe's second):
		// for a check that is an endpoint that cannot be reached, however
		// far the client's own retries got.
		return &Error{Backend: BackendS3, Op: "check", Key: s.bucket, Kind: ErrUnreachable, temporary: true,
			Detail: "no answer in time: " + scrub(err.Error(), s.secret), cause: context.DeadlineExceeded}
	}
	return s.fail("check", s.bucket, err)
}
