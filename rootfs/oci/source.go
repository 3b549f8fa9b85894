package oci

import (
	"context"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// imageSource is one kind of place images come from: a registry (with its
// mirrors), an OCI image layout directory or a `docker save` tarball. It
// resolves a reference of its kind to an Image whose blobSource serves the
// layers. Resolve picks the imageSource by the reference's kind and Fetch
// reads through the blobSource; neither tells the kinds apart otherwise.
type imageSource interface {
	// resolve reads the manifest and config of the image pr names; src
	// carries the credentials of registry sources.
	resolve(ctx context.Context, pr ParsedRef, src Source) (*Image, error)
}

// blobSource is where one resolved image's blobs come from: registrySource
// (the endpoint that served the manifest, then the later ones),
// layoutSource and archiveSource. Fetch downloads through it alone.
type blobSource interface {
	// key identifies the source; a waiter retries a shared download itself
	// when the leader read from another source and failed.
	key() string
	// openers lists the places blob d can be read from, in the order to try.
	openers(d v1.Hash) []blobOpener
}

// blobOpener opens a blob at one place. The bytes are not trusted: the cache
// checks size and digest while writing them.
type blobOpener struct {
	where string // repository or offline reference, for messages
	host  string // registry host ("" offline), for authentication messages
	// ranged tells that ranges of a blob may be read over several
	// connections at once (a registry); an offline blob is read by one.
	ranged bool
	// open reads bytes [offset, end) of the blob of size bytes, where the
	// place can; start is where the returned body begins: offset, or 0
	// when the place serves the blob only whole (a registry ignoring
	// Range), for the caller to skip what it already has. A body that
	// starts at offset may run on past end; the caller reads what it
	// asked for. With whole false, a place serving the blob only whole
	// answers errNoRanges instead.
	open func(ctx context.Context, offset, end, size int64, whole bool) (body io.ReadCloser, start int64, err error)
}
