// Package layercodec decodes layer blobs: it tells gzip, zstd and plain tar
// apart by their magic bytes, maps that to layer media types, opens the
// matching decompressor, and reads a decoded stream ahead of its consumer on
// a goroutine of its own.
//
// Gzip inflates with ISA-L when libisal.so.2 loads at run time (dlopen:
// the binary does not link it, and runs without it), else with
// klauspost/compress; the caller chooses with an Inflater (InflaterGo
// forces the latter), resolved once by NewGzipInflater, whose Backend
// names the choice. Both check each member's CRC-32 and
// size and reject anything after the last member that is not a member.
//
// It is the one home of layer codecs in rootfs: the builder decodes layers
// with Decompress, the layer cache's zstd transcoder reads gzip with
// NewGzipReader, and the offline image sources name layers with Detect.
package layercodec
