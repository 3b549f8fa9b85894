//go:build !cgo || !linux

package layercodec

import (
	"errors"
	"io"
)

// isalLib stands in for the loaded library in builds without cgo, where
// ISA-L cannot be called and every gzip stream takes the pure-Go inflater.
type isalLib struct{}

// loadISAL always fails without cgo.
func loadISAL(path string) (*isalLib, error) {
	return nil, errors.New("load " + path + ": built without cgo")
}

func newISALReader(*isalLib, io.Reader) (io.ReadCloser, error) {
	return nil, errors.New("isal: built without cgo")
}

func newISALReaderSize(*isalLib, io.Reader, int) (io.ReadCloser, error) {
	return nil, errors.New("isal: built without cgo")
}
