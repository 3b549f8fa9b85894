// Package images builds container images for tests and benchmarks and
// serves them: images with OCI media types made from tar layers encoded
// with gzip, zstd or nothing (New, NewIndex), an image made from a
// directory tree (TreeImage), a realistic Debian root filesystem made by
// debootstrap and cached between runs (DebianRootfs, DebianImage), and
// go-containerregistry's in-memory registry on httptest, with request
// counting and optional handler wrappers such as BasicAuth
// (StartRegistry).
//
// It is test support: only _test.go files import it.
package images
