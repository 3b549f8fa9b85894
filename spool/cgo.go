//go:build cgo

package spool

import (
	"errors"
	"fmt"

	"github.com/mattn/go-sqlite3"
)

// haveCgo: the SQLite driver is compiled in (it needs cgo).
const haveCgo = true

// storageError marks err with ErrCannotWrite when SQLite failed for want
// of writable storage rather than for anything in the data, so callers
// can answer "try again later" instead of a final failure.
func storageError(err error) error {
	var se sqlite3.Error
	if !errors.As(err, &se) {
		return err
	}
	switch se.Code {
	case sqlite3.ErrFull, sqlite3.ErrIoErr, sqlite3.ErrReadonly, sqlite3.ErrCantOpen:
		return fmt.Errorf("%w: %w", ErrCannotWrite, err)
	}
	return err
}
