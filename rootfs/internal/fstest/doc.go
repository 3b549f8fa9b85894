// Package fstest holds test helpers shared by the rootfs packages: a
// builder of tar layers, a corpus of test images (and hostile layers),
// in-memory data stores, snapshots of a directory or an in-memory inode tree
// with a readable diff, and a reference flattening done by umoci.
package fstest
