// Package rootfs turns an OCI image into a published ext4 template image:
// it resolves the image, fetches its layers through a digest-verified cache,
// flattens them onto an in-memory tree whose file data streams straight into
// the ext4 writer, injects envd and the egress CA, and publishes the result
// atomically in the artifact store. Nothing from an image is ever written to
// the host filesystem except the ext4 file itself.
//
// The package knows nothing of HTTP, CubeMaster or the spool: the agent
// drives it and turns its progress values into reports. It is the facade of
// the image build: the agent and the command build images through rootfs
// alone (Builder, Source, PullOptions, CacheStats, ValidateImageRef), never
// through the subpackages doing the work: oci (image sources), blobcache
// (the layer cache), layercodec (layer decoding), flatten, ext4 and inject.
// Reading a built image back is rootfs/inspect's, which the command uses.
package rootfs
