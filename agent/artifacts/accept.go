package artifacts

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/cubesandbox/cubetemplatecenter/rootfs"
)

// Accepted is an image received for an artifact (template merge and
// migration) and where it now lies.
type Accepted struct {
	Path   string
	SHA256 string
	Size   int64
	// Reused says an identical image was in place already and was kept.
	Reused bool
}

// Accept stores body as artifact id's image. It streams to a temporary
// name beside the final path while it hashes, so nothing is buffered or
// copied twice; an identical image already in place is kept (Reused). The
// file is written and hashed, and the image in place compared, before the
// artifact's lock is taken: the lock, which build starts wait on, covers
// the rename alone. An empty body is ErrEmpty; an artifact held by a build
// or a reuse is ErrBuilding; a failure to read the body or write the file
// is a *WriteError.
func (a *Artifacts) Accept(ctx context.Context, id string, body io.Reader) (Accepted, error) {
	f, err := a.store.CreateTemp(id)
	if err != nil {
		return Accepted{}, err
	}
	installed := false
	defer func() {
		if !installed {
			a.store.Discard(f, id)
		}
	}()
	sum, size, err := rootfs.CopyHashed(ctx, f, body)
	switch {
	case err != nil:
		return Accepted{}, &WriteError{Err: err}
	case size == 0:
		return Accepted{}, ErrEmpty
	}
	acc := Accepted{Path: a.store.ArtifactPath(id), SHA256: sum, Size: size}
	if fi, err := os.Stat(acc.Path); err == nil && fi.Mode().IsRegular() && fi.Size() == size {
		if have, err := rootfs.FileSHA256(ctx, acc.Path); err == nil && have == sum {
			acc.Reused = true
			return acc, nil
		}
	}
	if err := f.Chmod(0o644); err != nil {
		return Accepted{}, fmt.Errorf("store upload: %w", err)
	}
	err = a.whenIdle(id, func() error {
		installed = true
		return a.store.Commit(f, id)
	})
	if err != nil {
		return Accepted{}, err
	}
	return acc, nil
}

// WriteError is a failure to read an upload's body or to write it to the
// store; it wraps the cause (a body limit, a full store) for errors.Is and
// errors.As.
type WriteError struct{ Err error }

func (e *WriteError) Error() string { return "store upload: " + e.Err.Error() }

// Unwrap returns the cause.
func (e *WriteError) Unwrap() error { return e.Err }
