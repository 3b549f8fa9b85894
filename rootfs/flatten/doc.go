// Package flatten applies the layers of an OCI image, bottom-up, onto an
// in-memory tree of ext4 inodes whose file data lives in the image being
// written, so nothing from the image ever touches the host filesystem.
//
// Layers are applied in order, the way containerd's archive.Apply and umoci
// unpack them: whiteouts and opaque directories remove what lower layers
// created, hard links may point at files of lower layers, and a path that
// changes type replaces what was there. Hostile entries (absolute names,
// escapes through "..", writes below a symlink, dangling hard links) fail the
// layer with an *EntryError instead of being followed.
//
// A Tree is not safe for concurrent use, and must be discarded after any
// error from ApplyLayer.
package flatten
