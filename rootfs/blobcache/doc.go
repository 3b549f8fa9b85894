// Package blobcache keeps layer blobs on the node: a content-addressed,
// digest-verified, LRU-evicted store shared by all builds, with one
// download per blob at a time, and an optional background re-encode of gzip
// blobs as zstd.
//
// Blobs are keyed by the hex of their sha256 as served. Acquire pins a blob,
// verifying a file found on disk once per process or obtaining a missing or
// corrupt one through the caller's download function, which writes it as a
// Partial (Create, Fill, Commit): readers can follow a
// Partial while it is written, and it enters the cache only once its size
// and sha256 are right. Concurrent Acquires of one blob share that work. Open reads a pinned
// blob, Release unpins it. The files are the truth: <Dir>/blobs/sha256/<hex>
// as served, <Dir>/blobs/zstd/<hex>-<zstd hex> once transcoded, the last use
// kept as the file mtime so the LRU order survives restarts. Where blobs come
// from is the caller's business (rootfs/oci).
package blobcache
