package blobcache

import (
	"context"
	"errors"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrDigestMismatch marks a blob whose sha256 or size differs from what
	// it was stored or asked for under.
	ErrDigestMismatch = errors.New("digest mismatch")
	// ErrLocked marks a cache directory held by another Cache.
	ErrLocked = errors.New("cache directory in use")
)

// isCtxErr reports whether err comes from a cancelled or expired context.
func isCtxErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}
