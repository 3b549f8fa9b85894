package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestUsageErrors: command-line mistakes are usage errors naming the
// problem, before anything is built or downloaded.
func TestUsageErrors(t *testing.T) {
	env := func(string) string { return "" }
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-version", "v1"}, "no -platform"},
		{[]string{"-platform", "amd64", "-version", "v1"}, "is not GOARCH=BINARY"},
		{[]string{"-platform", "mips=bin/x", "-version", "v1"}, "no Debian architecture"},
		{[]string{"-platform", "amd64=bin/x"}, "-version is required"},
		{[]string{"-platform", "amd64=bin/x", "-version", "1.0+git"}, "cannot be an image tag"},
		{[]string{"-platform", "amd64=bin/x", "-version", "v1"}, "SOURCE_DATE_EPOCH is unset"},
		{[]string{"-platform", "amd64=bin/x", "-version", "v1", "-source-date-epoch", "yesterday"}, "not a Unix time"},
		{[]string{"-platform", "amd64=bin/x", "-version", "v1", "extra"}, "unexpected arguments"},
	} {
		err := run(context.Background(), c.args, env, slog.New(slog.DiscardHandler), io.Discard)
		var u usageError
		if err == nil || !errors.As(err, &u) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("tcimage %q = %v, want a usage error with %q", c.args, err, c.want)
		}
	}
}

// TestDropped: documentation goes, copyright files stay.
func TestDropped(t *testing.T) {
	for name, want := range map[string]bool{
		"usr/share/man/man8/x.8.gz":                       true,
		"usr/share/lintian/overrides/libc6":               true,
		"usr/share/doc/libc6/changelog.Debian.gz":         true,
		"usr/share/doc/ca-certificates/examples/a/b":      true,
		"usr/share/doc/libc6/copyright":                   false,
		"usr/share/doc/libc6":                             false,
		"usr/lib/x86_64-linux-gnu/libisal.so.2.0.30":      false,
		"usr/share/ca-certificates/mozilla/ACCVRAIZ1.crt": false,
	} {
		if got := dropped(name); got != want {
			t.Errorf("dropped(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestTreeTar: the layer's tar is sorted with parents first, root-owned
// unless said otherwise, every time the given one, and the same bytes
// whatever order the files were added in; a path two packages ship
// differently is an error.
func TestTreeTar(t *testing.T) {
	mtime := time.Unix(1700000000, 0)
	files := []*entry{
		{name: "usr/bin/b", kind: tar.TypeReg, mode: 0o755, data: []byte("b")},
		{name: "etc/a", kind: tar.TypeReg, mode: 0o644, data: []byte("a")},
		{name: "var/lib/x", kind: tar.TypeDir, mode: 0o750, uid: 65532, gid: 65532},
		{name: "lib64/ld.so", kind: tar.TypeSymlink, mode: 0o777, link: "/lib/ld.so"},
	}
	layer := func(order []int) []byte {
		tr := newTree()
		for _, i := range order {
			e := *files[i]
			if err := tr.add(&e); err != nil {
				t.Fatal(err)
			}
		}
		var b bytes.Buffer
		if err := tr.writeTar(&b, mtime); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	one, two := layer([]int{0, 1, 2, 3}), layer([]int{3, 2, 1, 0})
	if !bytes.Equal(one, two) {
		t.Error("the same files added in another order give another tar")
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(one))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if !h.ModTime.Equal(mtime) || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: mtime %v uname %q gname %q, want %v and no names", h.Name, h.ModTime, h.Uname, h.Gname, mtime)
		}
		if want := 0; h.Name != "var/lib/x/" && (h.Uid != want || h.Gid != want) {
			t.Errorf("%s: owner %d:%d, want root", h.Name, h.Uid, h.Gid)
		}
		if h.Name == "var/lib/x/" && (h.Uid != 65532 || h.Gid != 65532 || h.Mode != 0o750) {
			t.Errorf("var/lib/x/: owner %d:%d mode %o, want 65532:65532 0750", h.Uid, h.Gid, h.Mode)
		}
	}
	want := []string{"etc/", "etc/a", "lib64/", "lib64/ld.so", "usr/", "usr/bin/", "usr/bin/b", "var/", "var/lib/", "var/lib/x/"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Errorf("tar entries %q, want %q", names, want)
	}

	tr2 := newTree()
	if err := tr2.add(&entry{name: "etc/a", kind: tar.TypeReg, mode: 0o644, data: []byte("a"), owner: "p1"}); err != nil {
		t.Fatal(err)
	}
	if err := tr2.add(&entry{name: "etc/a", kind: tar.TypeReg, mode: 0o644, data: []byte("a"), owner: "p2"}); err != nil {
		t.Errorf("the same file from two packages: %v", err)
	}
	if err := tr2.add(&entry{name: "etc/a", kind: tar.TypeReg, mode: 0o644, data: []byte("other"), owner: "p3"}); err == nil || !strings.Contains(err.Error(), "p1 and p3") {
		t.Errorf("a conflicting file = %v, want an error naming both packages", err)
	}
}

// TestCheckMachine: a binary goes only into its own architecture's image,
// and a file that is no ELF binary is refused.
func TestCheckMachine(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := checkMachine(self, runtime.GOARCH); err != nil {
		t.Errorf("the test binary for %s: %v", runtime.GOARCH, err)
	}
	other := "arm64"
	if runtime.GOARCH == "arm64" {
		other = "amd64"
	}
	if err := checkMachine(self, other); err == nil || !strings.Contains(err.Error(), "GOARCH="+other) {
		t.Errorf("a %s binary as %s = %v, want a refusal", runtime.GOARCH, other, err)
	}
	script := filepath.Join(t.TempDir(), "templatecenter")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := checkMachine(script, runtime.GOARCH); err == nil {
		t.Error("a shell script passed as the binary was accepted")
	}
}
