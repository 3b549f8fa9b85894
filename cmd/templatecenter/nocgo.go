//go:build !cgo

package main

// cgoEnabled says whether the binary was built with cgo, which the SQLite
// spool's driver needs: without it serve and jobs refuse to start (the
// spool package says why) while build and inspect work.
const cgoEnabled = false
