package layercodec_test

import (
	"bytes"
	"io"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/inflatetest"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/layercodec"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

func TestDecompress(t *testing.T) {
	inf := inflatetest.Inflater(t)
	raw, err := imagetest.Layer{imagetest.Blob("f", 3<<20, 42), imagetest.File("g", "g")}.Tar()
	if err != nil {
		t.Fatal(err)
	}
	gz, err := images.Gzip.Encode(raw)
	if err != nil {
		t.Fatal(err)
	}
	half := len(raw) / 2
	gz1, _ := images.Gzip.Encode(raw[:half])
	gz2, _ := images.Gzip.Encode(raw[half:])
	tests := []struct {
		name string
		enc  images.Compression
		blob []byte
		want []byte
	}{
		{"Gzip", images.Gzip, nil, raw},
		{"Zstd", images.Zstd, nil, raw},
		{"Uncompressed", images.Uncompressed, nil, raw},
		{"GzipMultiMember", "", append(append([]byte{}, gz1...), gz2...), raw},
		{"Empty", "", []byte{}, []byte{}},
		{"OneByte", "", []byte{0x1f}, []byte{0x1f}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			blob := tc.blob
			if tc.enc != "" {
				var err error
				if blob, err = tc.enc.Encode(raw); err != nil {
					t.Fatal(err)
				}
			}
			rc, err := layercodec.Decompress(bytes.NewReader(blob), inf)
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

	zs, err := images.Zstd.Encode(raw)
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
			rc, err := layercodec.Decompress(bytes.NewReader(blob), inf)
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

// TestGzipInflaterFromEnv checks the inflater the environment asks for, as
// the binary resolves it: make test expects ISA-L, make test-no-isal
// forces Go.
func TestGzipInflaterFromEnv(t *testing.T) {
	got := inflatetest.Inflater(t) // fails on a mismatch with the environment
	if b := got.Backend(); b != layercodec.BackendISAL && b != layercodec.BackendGo {
		t.Errorf("Backend() = %q, want %s or %s", b, layercodec.BackendISAL, layercodec.BackendGo)
	}
	if (got.Backend() == layercodec.BackendGo) != (got.Reason() != "") {
		t.Errorf("Backend() = %s with Reason() %q", got.Backend(), got.Reason())
	}
	var none *layercodec.GzipInflater
	if none.Backend() != layercodec.BackendGo {
		t.Errorf("nil inflater Backend() = %s, want %s", none.Backend(), layercodec.BackendGo)
	}
}
