// Package ext4 writes a complete ext4 filesystem image in one pass: callers
// stream regular-file content into the image first (Writer.WriteData), then
// hand over the finished tree of inodes (Writer.Finish), which lays out all
// metadata deterministically around the data already written.
//
// The image uses 4 KiB blocks, 256-byte inodes, extents, flex_bg, htree
// directories and metadata_csum, optionally with a jbd2 journal; the same
// Options, data calls and tree always give a byte-identical file. See
// docs/ext4-writer.md for the layout decisions.
package ext4
