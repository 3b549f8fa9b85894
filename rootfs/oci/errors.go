package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/blobcache"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrInvalidRef marks a reference ValidateImageRef rejects.
	ErrInvalidRef = errors.New("invalid image reference")
	// ErrNotFound marks an image, tag or blob the source does not have.
	ErrNotFound = errors.New("not found")
	// ErrUnauthorized marks a registry refusing the credentials (HTTP 401).
	ErrUnauthorized = errors.New("unauthorized")
	// ErrDenied marks a registry refusing access to a repository (HTTP 403).
	ErrDenied = errors.New("denied")
	// ErrNoPlatform marks an index without an image for the wanted platform.
	ErrNoPlatform = errors.New("no matching platform")
	// ErrDigestMismatch marks content whose sha256 or size differs from its
	// descriptor; the layer cache's blobcache.ErrDigestMismatch is the same
	// value.
	ErrDigestMismatch = blobcache.ErrDigestMismatch
	// ErrUnsupported marks content that is not a Linux container image this
	// package can use (schema 1 manifests, artifacts, unknown layer types).
	ErrUnsupported = errors.New("unsupported image")
	// ErrLocalDisabled marks an offline reference outside Options.LocalRoots.
	ErrLocalDisabled = errors.New("offline source not allowed")
	// ErrCacheLocked marks a cache directory held by another Puller (it is
	// blobcache.ErrLocked).
	ErrCacheLocked = blobcache.ErrLocked
)

// kindError carries a readable message (which already contains the cause's
// text) and a sentinel for errors.Is.
type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// classify turns registry HTTP failures into messages that say what to do.
// what names the operation ("resolve example.com/app:1",
// "fetch layer sha256:… from example.com/app"); host is the registry host.
func classify(err error, what, host string) error {
	if err == nil {
		return nil
	}
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusUnauthorized:
			return &kindError{kind: ErrUnauthorized, msg: fmt.Sprintf(
				"%s: authentication to %s failed (check registry_username/registry_password): %v", what, host, err)}
		case http.StatusForbidden:
			return &kindError{kind: ErrDenied, msg: fmt.Sprintf("%s: access denied by %s: %v", what, host, err)}
		case http.StatusNotFound:
			return &kindError{kind: ErrNotFound, msg: fmt.Sprintf("%s: unexpected status 404 (not found): %v", what, err)}
		}
		return fmt.Errorf("%s: unexpected status %d: %w", what, te.StatusCode, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// isTransient reports whether a failed blob download is worth repeating from
// the same place.
func isTransient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if errors.Is(err, ErrDigestMismatch) {
		return false
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	var te *transport.Error
	if errors.As(err, &te) {
		return te.Temporary()
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// isCtxErr reports whether err comes from a cancelled or expired context.
func isCtxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// queryPart matches the query string of a URL inside an error message;
// signed blob URLs and token endpoints carry secrets there.
var queryPart = regexp.MustCompile(`(https?://[^\s?"'<>]+)\?[^\s"'<>]*`)

// redactedError hides secrets from the message of the error it wraps. It
// answers errors.Is for the wrapped chain but does not expose it to
// errors.As, so the raw text cannot be reached by accident.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string        { return e.msg }
func (e *redactedError) Is(target error) bool { return errors.Is(e.err, target) }

// redact scrubs URL query strings and the given secrets from err's message.
func redact(err error, secrets ...string) error {
	if err == nil {
		return nil
	}
	msg := queryPart.ReplaceAllString(err.Error(), "$1?REDACTED")
	for _, s := range secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, "REDACTED")
		}
	}
	return &redactedError{msg: msg, err: err}
}
