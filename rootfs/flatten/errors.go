package flatten

import (
	"errors"
	"fmt"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/safetext"
)

// Errors returned by path operations on a Tree; missing paths wrap
// fs.ErrNotExist.
var (
	// ErrNotDir means a path component that must be a directory is not one.
	ErrNotDir = errors.New("not a directory")
	// ErrIsDir means a directory was found where a non-directory is needed.
	ErrIsDir = errors.New("is a directory")
	// ErrLoop means more than MaxSymlinkHops symlinks were followed.
	ErrLoop = errors.New("too many levels of symbolic links")
	// ErrSymlink means a path crosses a symlink where none may be followed.
	ErrSymlink = errors.New("path crosses a symlink")
	// ErrEscape means a path leaves the root through "..".
	ErrEscape = errors.New("path escapes the root")
	// ErrTooLarge means a file is larger than MaxReadFile.
	ErrTooLarge = errors.New("file too large to read whole")
)

// EntryError reports a tar entry that cannot be applied: a hostile or
// malformed entry, or a failure while storing its data.
type EntryError struct {
	// Layer is the index of the layer, as passed to ApplyLayer.
	Layer int
	// Name is the entry's name as found in the tar stream.
	Name string
	// Reason says what is wrong with the entry.
	Reason string
	// Err is the underlying error, if any.
	Err error
}

// Error implements error.
func (e *EntryError) Error() string {
	s := fmt.Sprintf("layer %d: entry %s: %s", e.Layer, safetext.Name(e.Name), e.Reason)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the underlying error.
func (e *EntryError) Unwrap() error { return e.Err }
