// Package imagetest holds the test fixtures of the rootfs packages that know
// nothing of ext4's Go types, so that rootfs/ext4's own tests can use them
// too: a builder of tar layers (Layer, File, Dir...), a corpus of test
// images with the state their flattening must give (Corpus) and hostile
// layer stacks (Hostile), the e2fsprogs and mount(8) steps on an image file
// (Fsck, Mount, MountRW, Umount, Tmpfs, Tool), snapshots of a directory
// with a readable diff (SnapshotDir, Diff, Check) and file hashes
// (FileSHA256), and the reference flattening done by umoci (UmociRootfs,
// Image.ReferenceOptions).
package imagetest
