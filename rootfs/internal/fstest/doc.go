// Package fstest holds the ext4-specific test helpers of the rootfs
// packages: in-memory data stores for flatten.Tree (MemStore, DiscardStore)
// and snapshots of an in-memory ext4.Node tree (SnapshotTree). The helpers
// that know nothing of ext4 — tar layers, the corpus, mounts, snapshots of a
// directory and diffs, umoci's reference — are in imagetest, which
// rootfs/ext4's own tests can import.
package fstest
