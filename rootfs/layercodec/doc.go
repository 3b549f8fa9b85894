// Package layercodec decodes layer blobs: it tells gzip, zstd and plain tar
// apart by their magic bytes, maps that to layer media types, opens the
// matching decompressor, and reads a decoded stream ahead of its consumer on
// a goroutine of its own.
//
// It is the one home of layer codecs in rootfs: the builder decodes layers
// with Decompress, the layer cache's zstd transcoder reads gzip with
// NewGzipReader, and the offline image sources name layers with Detect.
package layercodec
