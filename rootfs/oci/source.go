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
	// open reads the blob of size bytes from byte offset on, where the
	// place can; start is where the returned body begins: offset, or 0
	// when the place serves the blob only whole (a registry ignoring
	// Range), for the caller to skip what it already has.
	open func(ctx context.Context, offset, size int64) (body io.ReadCloser, start int64, err error)
}
