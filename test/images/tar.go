package images

import (
	"archive/tar"
	"bytes"
	"sort"
	"testing"
)

// TarOf returns an uncompressed tar stream of regular files, name to
// content, mode 0644, in name order: the smallest layer a test can make.
func TarOf(tb testing.TB, files map[string]string) []byte {
	tb.Helper()
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(files[n]))}); err != nil {
			tb.Fatalf("images: tar %s: %v", n, err)
		}
		if _, err := tw.Write([]byte(files[n])); err != nil {
			tb.Fatalf("images: tar %s: %v", n, err)
		}
	}
	if err := tw.Close(); err != nil {
		tb.Fatalf("images: tar: %v", err)
	}
	return b.Bytes()
}
