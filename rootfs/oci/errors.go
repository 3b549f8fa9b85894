package oci

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/blobcache"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
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
	// ErrIncomplete marks a read of a layer Layers.Open streamed whose
	// download then failed; Layers.Wait gives the download's error.
	ErrIncomplete = blobcache.ErrAborted
	// ErrCacheLocked marks a cache directory held by another Puller (it is
	// blobcache.ErrLocked).
	ErrCacheLocked = blobcache.ErrLocked
)

// kindError carries a readable message (which already contains the cause's
// text, or the part of it fit to show) and a sentinel for errors.Is; cause,
// when set, stays reachable for errors.Is and errors.As.
type kindError struct {
	kind  error
	cause error
	msg   string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() []error {
	out := make([]error, 0, 2)
	for _, err := range []error{e.kind, e.cause} {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// maxCauseText caps the text of a failure whose message may quote what a
// server sent (a redirect's location, a token endpoint's answer).
const maxCauseText = 300

// classify turns registry HTTP failures into messages that say what to do.
// what names the operation ("resolve example.com/app:1",
// "fetch layer sha256:… from example.com/app"); host is the registry host.
// A registry's answer shows as its status, its error codes and a fixed
// reason: never its body, which may be anything the server behind the
// address chose to send (an internal service, a login page).
func classify(err error, what, host string) error {
	if err == nil {
		return nil
	}
	var te *transport.Error
	if errors.As(err, &te) {
		detail := registryCodes(te)
		switch te.StatusCode {
		case http.StatusUnauthorized:
			return &kindError{kind: ErrUnauthorized, cause: err, msg: fmt.Sprintf(
				"%s: authentication to %s failed (check registry_username/registry_password): status 401%s", what, host, detail)}
		case http.StatusForbidden:
			return &kindError{kind: ErrDenied, cause: err, msg: fmt.Sprintf("%s: access denied by %s: status 403%s", what, host, detail)}
		case http.StatusNotFound:
			return &kindError{kind: ErrNotFound, cause: err, msg: fmt.Sprintf("%s: unexpected status 404 (not found)%s", what, detail)}
		}
		return &kindError{cause: err, msg: fmt.Sprintf("%s: unexpected status %d (%s)%s",
			what, te.StatusCode, strings.ToLower(http.StatusText(te.StatusCode)), detail)}
	}
	var nd *NetworkDeniedError
	var se *StallError
	switch {
	case errors.As(err, &nd):
		return &kindError{cause: err, msg: fmt.Sprintf("%s: %v", what, nd)}
	case errors.As(err, &se):
		return &kindError{cause: err, msg: fmt.Sprintf("%s: %v", what, se)}
	case strings.Contains(err.Error(), "no token in bearer response"):
		return &kindError{cause: err, msg: fmt.Sprintf("%s: the token endpoint of %s answered without a token", what, host)}
	case errors.Is(err, ErrDigestMismatch) || errors.Is(err, ErrTooLarge) || isCtxErr(err):
		return fmt.Errorf("%s: %w", what, err) // our own words
	}
	return &kindError{cause: err, msg: what + ": " + safetext.Clip(err.Error(), maxCauseText)}
}

// registryCodes lists the error codes of a registry's answer (", registry
// error MANIFEST_UNKNOWN"), or "" when it has none. Only well-formed codes
// (upper case, digits, underscores, at most 32 characters) are shown, four
// at most; the messages and details next to them never are.
func registryCodes(te *transport.Error) string {
	var codes []string
	for _, d := range te.Errors {
		c := string(d.Code)
		if len(c) == 0 || len(c) > 32 || strings.Trim(c, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != "" || slices.Contains(codes, c) {
			continue
		}
		if codes = append(codes, c); len(codes) == 4 {
			break
		}
	}
	switch len(codes) {
	case 0:
		return ""
	case 1:
		return ", registry error " + codes[0]
	}
	return ", registry errors " + strings.Join(codes, ", ")
}

// isTransient reports whether a failed blob download is worth repeating from
// the same place.
func isTransient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if errors.Is(err, ErrDigestMismatch) || errors.Is(err, ErrNetworkDenied) || errors.Is(err, ErrTooLarge) {
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
