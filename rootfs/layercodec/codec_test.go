package layercodec_test

import (
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/layercodec"
)

func TestDetect(t *testing.T) {
	tests := []struct {
		name  string
		magic []byte
		want  layercodec.Compression
		media types.MediaType
	}{
		{"Gzip", []byte{0x1f, 0x8b, 0x08, 0x00}, layercodec.Gzip, types.DockerLayer},
		{"GzipTwoBytes", []byte{0x1f, 0x8b}, layercodec.Gzip, types.DockerLayer},
		{"Zstd", []byte{0x28, 0xb5, 0x2f, 0xfd}, layercodec.Zstd, types.OCILayerZStd},
		{"ZstdTruncated", []byte{0x28, 0xb5, 0x2f}, layercodec.Uncompressed, types.DockerUncompressedLayer},
		{"Tar", []byte("etc/"), layercodec.Uncompressed, types.DockerUncompressedLayer},
		{"Empty", nil, layercodec.Uncompressed, types.DockerUncompressedLayer},
		{"OneByte", []byte{0x1f}, layercodec.Uncompressed, types.DockerUncompressedLayer},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := layercodec.Detect(tc.magic)
			if got != tc.want {
				t.Errorf("Detect(% x) = %v, want %v", tc.magic, got, tc.want)
			}
			if mt := got.MediaType(); mt != tc.media {
				t.Errorf("%v.MediaType() = %s, want %s", got, mt, tc.media)
			}
		})
	}
}
