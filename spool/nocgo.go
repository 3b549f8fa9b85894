//go:build !cgo

package spool

// haveCgo: without cgo the SQLite driver is a stub that fails every
// connection, so open refuses before touching the spool file.
const haveCgo = false

// storageError returns err: without cgo no spool opens, so no SQLite
// error reaches here.
func storageError(err error) error { return err }
