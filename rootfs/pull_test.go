package rootfs_test

import (
	"errors"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/oci"
)

func TestValidateImageRef(t *testing.T) {
	tests := []struct {
		ref      string
		registry string
	}{
		{"debian:12", "index.docker.io"},
		{"docker.io/library/debian:12", "index.docker.io"},
		{"http://127.0.0.1:5000/app:v1", "127.0.0.1:5000"},
		{"quay.io/team/app@sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "quay.io"},
		{"oci-layout:/srv/images/app:v1", ""},
		{"docker-archive:/srv/images/app.tar", ""},
	}
	for _, tc := range tests {
		got, err := rootfs.ValidateImageRef(tc.ref)
		if err != nil {
			t.Errorf("ValidateImageRef(%q): %v", tc.ref, err)
			continue
		}
		if got.Registry != tc.registry {
			t.Errorf("ValidateImageRef(%q).Registry = %q, want %q", tc.ref, got.Registry, tc.registry)
		}
	}
	for _, ref := range []string{"", "-bad", "UPPER/case:tag", "oci-layout:relative/dir"} {
		if _, err := rootfs.ValidateImageRef(ref); !errors.Is(err, oci.ErrInvalidRef) {
			t.Errorf("ValidateImageRef(%q) error = %v, want ErrInvalidRef", ref, err)
		}
	}
}
