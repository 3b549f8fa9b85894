// Package oci turns an image reference into verified, cached layer blobs.
//
// Resolve reads an image's manifest and config without downloading layers,
// through the image source the reference names: a registry and its mirrors
// (registry.go), an OCI image layout directory (layout.go) or a `docker
// save` tarball (archive.go, tarindex.go). Each source implements
// imageSource and serves its layers through the blobSource seam, so Fetch
// treats them alike: it brings every layer into the layer cache and returns
// pinned handles to the compressed blobs, in manifest order.
//
// Every registry request goes through one transport: the network policy
// (netpolicy.go: denied and allowed networks, checked on the address each
// connection reaches), the stall watchdog and the caps on documents read
// whole (stall.go). Registry failures show as status and error codes,
// never as the body a server sent (errors.go).
//
// The cache itself (digest verification, LRU eviction, one download per
// blob, the background zstd transcoder) lives in rootfs/blobcache; this
// package reaches it through the blobStore interface it declares. Layer
// decoding is rootfs/layercodec's job.
package oci
