// Package images builds container images for tests and benchmarks and
// serves them: images with OCI media types made from tar layers encoded
// with gzip, zstd or nothing (New, NewIndex, TarOf), an image made from a
// directory tree (TreeImage; ScanTree for its layers as tar streams), a
// realistic Debian root filesystem made by debootstrap and cached between
// runs (DebianRootfs, DebianImage), images written as an OCI layout
// (WriteLayout), and go-containerregistry's in-memory registry on
// httptest, with request counting and optional handler wrappers such as
// BasicAuth (StartRegistry).
//
// It is test support, never part of the daemon: tests import it, and so
// does the benchmark harness bench/ (and through it bench/cmd/tcbench), for
// its images, the Debian tree and the tree packing.
package images
