package ext4

import (
	"errors"
	"fmt"
)

// Sentinel errors returned (wrapped) by the Writer.
var (
	// ErrInvalidNode marks a tree handed to Finish that cannot be stored:
	// a bad name, mode, symlink target or xattr. The message names the path.
	ErrInvalidNode = errors.New("invalid node")
	// ErrTooLarge means the content does not fit in Options.MaxSize.
	ErrTooLarge = errors.New("image exceeds maximum size")
	// ErrFinished is returned by calls on a Writer after Finish (or after a
	// failed Finish).
	ErrFinished = errors.New("writer already finished")
)

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

var errPunchUnsupported = errors.New("hole punching unsupported")
