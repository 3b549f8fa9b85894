package blobstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
)

// Backend names, as Store.Backend returns them and Options.Backend takes
// them: the wire contract's.
const (
	BackendS3 = api.BackendS3
	BackendFS = api.BackendFS
)

// MetadataSHA256 is the user-metadata key (x-amz-meta-sha256 on the wire)
// that carries an object's sha256 in hex.
const MetadataSHA256 = "sha256"

// MaxPresignTTL is the longest validity S3 accepts for a presigned URL.
const MaxPresignTTL = 7 * 24 * time.Hour

// Store keeps artifact objects. Every method takes ctx first and returns an
// *Error on failure.
type Store interface {
	// Backend returns BackendS3 or BackendFS, the name reports carry.
	Backend() string
	// Abilities says what the backend can do, for callers that would
	// otherwise switch on its name.
	Abilities() Abilities
	// Put streams size bytes from r to key with bounded memory, recording
	// sha256hex. The object is published only when the bytes read match
	// both size and sha256hex.
	Put(ctx context.Context, key string, r io.Reader, size int64, sha256hex string) error
	// PutFile is Put from a local file; the fs backend hard-links it when
	// it lies on the same filesystem.
	PutFile(ctx context.Context, key, path string, size int64, sha256hex string) error
	// Stat returns the object's size and recorded sha256; a missing object
	// is an error matching ErrNotFound.
	Stat(ctx context.Context, key string) (Info, error)
	// Get returns a small object's bytes, checked against its recorded
	// sha256; an object larger than maxBytes is an error matching
	// ErrSizeMismatch.
	Get(ctx context.Context, key string, maxBytes int64) ([]byte, error)
	// Delete removes the object; a missing object is success.
	Delete(ctx context.Context, key string) error
	// PresignGet returns a URL valid for ttl that downloads the object as an
	// attachment named after the key's base name. The fs backend returns ""
	// and an error matching ErrNotSupported.
	PresignGet(ctx context.Context, key string, ttl time.Duration) (string, error)
	// AbortIncomplete removes what interrupted Puts of key started before
	// startedBefore left behind (S3: incomplete multipart uploads; fs:
	// temporary files). A Put started later may be another replica's,
	// still running: it is left alone.
	AbortIncomplete(ctx context.Context, key string, startedBefore time.Time) error
	// Check tells whether the store is usable, for health checks: the error
	// matches ErrBucketMissing, ErrAccessDenied or ErrUnreachable when that
	// is the cause.
	Check(ctx context.Context) error
}

// Abilities are what a backend can do beyond the common ground of the
// Store methods.
type Abilities struct {
	// Presign: PresignGet returns download URLs for objects.
	Presign bool
	// LinkFiles: PutFile stores a local file without copying it when it
	// can (a hard link), so an upload through it has no progress to show.
	LinkFiles bool
	// LocalFallback: when a put fails for good, an artifact may still be
	// reported from the local store alone, as upstream does for S3 beside
	// the master's store. Without it the failure fails the job.
	LocalFallback bool
}

// Info describes a stored object.
type Info struct {
	// Key is the object's key.
	Key string
	// Size is the object's size in bytes.
	Size int64
	// SHA256 is the hex sha256 recorded at Put; empty for objects stored
	// without one (by other tools).
	SHA256 string
	// ModTime is when the object was stored.
	ModTime time.Time
	// ETag is the S3 entity tag; empty on fs.
	ETag string
}

// Sentinels, tested with errors.Is on the errors of every Store method.
var (
	// ErrNotFound: the object does not exist.
	ErrNotFound = errors.New("object not found")
	// ErrBucketMissing: the bucket (fs: the root directory) does not exist.
	ErrBucketMissing = errors.New("bucket does not exist")
	// ErrAccessDenied: the credentials are wrong or lack permission.
	ErrAccessDenied = errors.New("access denied")
	// ErrUnreachable: the endpoint could not be reached (network error,
	// connection refused, timeout).
	ErrUnreachable = errors.New("endpoint unreachable")
	// ErrNotSupported: the backend cannot do this (fs: presigned URLs).
	ErrNotSupported = errors.New("not supported by this backend")
	// ErrInvalidKey: the key is empty, absolute, not clean or escapes the root.
	ErrInvalidKey = errors.New("invalid object key")
	// ErrChecksumMismatch: the bytes read do not hash to the sha256 given.
	ErrChecksumMismatch = errors.New("sha256 mismatch")
	// ErrSizeMismatch: the source is shorter or longer than the size given.
	ErrSizeMismatch = errors.New("size mismatch")
)

// Error is a failed store operation. Its text names the backend, operation
// and key, and never contains credentials or signatures.
type Error struct {
	// Backend is BackendS3 or BackendFS.
	Backend string
	// Op is the operation: put, stat, delete, presign, abort, check.
	Op string
	// Key is the object key, if any.
	Key string
	// Kind is one of the sentinels, or nil for other failures.
	Kind error
	// Code and StatusCode are the S3 error code and HTTP status, if any.
	Code       string
	StatusCode int
	// Detail is the scrubbed text of the underlying error.
	Detail string

	// cause is kept for errors.Is only when it carries no text of its own
	// that could leak (context errors, fs errors).
	cause     error
	temporary bool
}

// Error renders "s3 put a/b.ext4: access denied: SignatureDoesNotMatch (403): ...".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Backend + " " + e.Op)
	if e.Key != "" {
		b.WriteString(" " + e.Key)
	}
	if e.Kind != nil {
		b.WriteString(": " + e.Kind.Error())
	}
	if e.Code != "" {
		fmt.Fprintf(&b, ": %s (%d)", e.Code, e.StatusCode)
	}
	if e.Detail != "" {
		b.WriteString(": " + e.Detail)
	}
	return b.String()
}

// Unwrap exposes Kind and the cause to errors.Is and errors.As.
func (e *Error) Unwrap() []error {
	var errs []error
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.cause != nil {
		errs = append(errs, e.cause)
	}
	return errs
}

// Temporary reports whether the failure was transient (network, 5xx, 429),
// so that a later attempt may succeed.
func (e *Error) Temporary() bool { return e.temporary }

// ArtifactKey returns the object key of an artifact: [prefix/]<artifactID>.ext4,
// with prefix trimmed of slashes.
func ArtifactKey(prefix, artifactID string) string {
	prefix = strings.Trim(prefix, "/")
	if prefix == "" {
		return artifactID + ".ext4"
	}
	return prefix + "/" + artifactID + ".ext4"
}

// getChecked reads at most maxBytes of r and checks them against sha256hex
// (when recorded).
func getChecked(r io.Reader, maxBytes int64, sha256hex string) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read object: %w", err)
	}
	if int64(len(data)) > maxBytes {
		return nil, fmt.Errorf("object exceeds %d bytes: %w", maxBytes, ErrSizeMismatch)
	}
	if sha256hex != "" {
		sum := sha256.Sum256(data)
		if hex.EncodeToString(sum[:]) != strings.ToLower(sha256hex) {
			return nil, fmt.Errorf("object bytes do not match its recorded sha256: %w", ErrChecksumMismatch)
		}
	}
	return data, nil
}

// sourceFailed is the error of a PutFile that cannot read its local file.
// It has no Kind: the file is missing or denied, not the object or the
// store, and a caller testing for ErrNotFound means the object.
func sourceFailed(backend, key string, err error) error {
	return &Error{Backend: backend, Op: "put", Key: key, Detail: err.Error(), cause: err}
}

// checkKey rejects keys that are empty, absolute, not in clean slash form,
// or that climb out with "..".
func checkKey(key string) error {
	switch {
	case key == "", len(key) > 1024, strings.ContainsAny(key, "\x00\\"), strings.HasPrefix(key, "/"),
		path.Clean(key) != key, key == "..", strings.HasPrefix(key, "../"):
		return fmt.Errorf("%w %q", ErrInvalidKey, key)
	}
	return nil
}

// checkPut validates Put's arguments.
func checkPut(key string, size int64, sha256hex string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if size < 0 {
		return fmt.Errorf("size %d is negative", size)
	}
	if len(sha256hex) != 64 || strings.Trim(strings.ToLower(sha256hex), "0123456789abcdef") != "" {
		return fmt.Errorf("%q is not a hex sha256", sha256hex)
	}
	return nil
}

// checkTTL validates a presigned URL's validity.
func checkTTL(ttl time.Duration) error {
	if ttl <= 0 || ttl > MaxPresignTTL {
		return fmt.Errorf("presign ttl %s is outside (0, %s]", ttl, MaxPresignTTL)
	}
	return nil
}

// Options selects and configures a backend.
type Options struct {
	// Backend is BackendS3, BackendFS, or "" for no blob store.
	Backend string
	// FSRoot is the fs backend's root directory (absolute).
	FSRoot string
	// S3 configures the S3 backend.
	S3 S3Options
}

// Open returns the Store opts describe, or nil (and no error) when
// opts.Backend is "": no blob store is configured.
func Open(opts Options) (Store, error) {
	switch opts.Backend {
	case "":
		return nil, nil
	case BackendFS:
		return NewFS(opts.FSRoot)
	case BackendS3:
		return NewS3(opts.S3)
	default:
		return nil, fmt.Errorf("open blob store: unknown backend %q", opts.Backend)
	}
}
