// Package oci turns an image reference into verified, cached layer blobs.
//
// Resolve reads an image's manifest and config (from a registry, an OCI image
// layout directory or a `docker save` tarball) without downloading layers;
// Fetch brings every layer into a content-addressed, digest-verified blob
// cache shared by all builds and returns pinned handles to the compressed
// blobs, in manifest order. The cache lives in <CacheDir>/blobs/sha256/<hex>,
// survives restarts, evicts least recently used blobs down to a quota and
// downloads a blob shared by concurrent builds only once.
package oci
