//go:build cgo

package main

// cgoEnabled says whether the binary was built with cgo, which the SQLite
// spool's driver needs.
const cgoEnabled = true
