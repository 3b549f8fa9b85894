package layercodec_test

import (
	"bytes"
	"io"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/fstest"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/layercodec"
)

func TestDecompress(t *testing.T) {
	raw, err := fstest.Layer{fstest.Blob("f", 3<<20, 42), fstest.File("g", "g")}.Tar()
	if err != nil {
		t.Fatal(err)
	}
	gz, err := fstest.Compress(fstest.Gzip, raw)
	if err != nil {
		t.Fatal(err)
	}
	half := len(raw) / 2
	gz1, _ := fstest.Compress(fstest.Gzip, raw[:half])
	gz2, _ := fstest.Compress(fstest.Gzip, raw[half:])
	tests := []struct {
		name string
		enc  fstest.Compression
		blob []byte
		want []byte
	}{
		{"Gzip", fstest.Gzip, nil, raw},
		{"Zstd", fstest.Zstd, nil, raw},
		{"Uncompressed", fstest.Uncompressed, nil, raw},
		{"GzipMultiMember", "", append(append([]byte{}, gz1...), gz2...), raw},
		{"Empty", "", []byte{}, []byte{}},
		{"OneByte", "", []byte{0x1f}, []byte{0x1f}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			blob := tc.blob
			if tc.enc != "" {
				var err error
				if blob, err = fstest.Compress(tc.enc, raw); err != nil {
					t.Fatal(err)
				}
			}
			rc, err := layercodec.Decompress(bytes.NewReader(blob))
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(rc)
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if err := rc.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if !bytes.Equal(got, tc.want) {
				t.Errorf("Decompress yields %d bytes, want %d identical bytes", len(got), len(tc.want))
			}
		})
	}

	zs, err := fstest.Compress(fstest.Zstd, raw)
	if err != nil {
		t.Fatal(err)
	}
	corrupt := append([]byte{}, gz...)
	corrupt[len(corrupt)-5] ^= 0xff // damages the CRC-32 trailer
	bad := map[string][]byte{
		"GzipTruncated": gz[:len(gz)/2],
		"GzipBadCRC":    corrupt,
		"ZstdTruncated": zs[:len(zs)/2],
		"GzipBadHeader": {0x1f, 0x8b, 0x00},
	}
	for name, blob := range bad {
		t.Run(name, func(t *testing.T) {
			rc, err := layercodec.Decompress(bytes.NewReader(blob))
			if err == nil {
				_, err = io.Copy(io.Discard, rc)
				rc.Close()
			}
			if err == nil {
				t.Error("Decompress of a damaged stream read without error")
			}
		})
	}
}
