package blobstore_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/blobstore"
)

func newFS(tb testing.TB) (*blobstore.FS, string) {
	tb.Helper()
	root := filepath.Join(tb.TempDir(), "root")
	f, err := blobstore.NewFS(root)
	if err != nil {
		tb.Fatalf("NewFS: %v", err)
	}
	return f, root
}

// openFS is the fs backend of the conformance suite: a store rooted in a
// directory of its own, whose probe reads the tree around it.
func openFS(tb testing.TB) *harness {
	tb.Helper()
	f, root := newFS(tb)
	return &harness{
		Store:     f,
		objects:   func(tb testing.TB) []string { objects, _ := fsTree(tb, root); return objects },
		leftovers: func(tb testing.TB) []string { _, leftovers := fsTree(tb, root); return leftovers },
		interrupt: func(tb testing.TB, key string, data []byte, sum string) ([]string, func(testing.TB)) {
			return fsInterrupt(tb, f, key, data, sum)
		},
		corrupt: func(tb testing.TB, key string) {
			tb.Helper()
			p, err := f.Path(key)
			if err != nil {
				tb.Fatal(err)
			}
			data, err := os.ReadFile(p)
			if err != nil || len(data) == 0 {
				tb.Fatalf("read %s to alter it: %d bytes, %v", p, len(data), err)
			}
			data[0] ^= 1
			if err := os.WriteFile(p, data, 0o644); err != nil {
				tb.Fatal(err)
			}
		},
		missing: func(tb testing.TB) (blobstore.Store, string) {
			tb.Helper()
			f, root := newFS(tb)
			if err := os.Remove(root); err != nil {
				tb.Fatal(err)
			}
			return f, root
		},
	}
}

// fsTree sorts the files in and beside root into published objects (their
// keys) and leftovers: temporary files (dot names), sidecars without their
// object, and anything outside the root (as ../name).
func fsTree(tb testing.TB, root string) (objects, leftovers []string) {
	tb.Helper()
	err := filepath.WalkDir(filepath.Dir(root), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		switch base := path.Base(rel); {
		case !filepath.IsLocal(rel), strings.HasPrefix(base, "."):
			leftovers = append(leftovers, rel)
		case strings.HasSuffix(base, blobstore.SidecarSuffix):
			if _, err := os.Stat(strings.TrimSuffix(p, blobstore.SidecarSuffix)); err != nil {
				leftovers = append(leftovers, rel)
			}
		default:
			objects = append(objects, rel)
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("walk %s: %v", root, err)
	}
	slices.Sort(objects)
	slices.Sort(leftovers)
	return objects, leftovers
}

// fsInterrupt leaves what a Put of key killed before its renames leaves:
// the object's and the sidecar's temporary files, named as FS names them.
// The object's has an old modification time, as a hard link of an old file
// has: only its change time says it is in use. complete renames both into
// place, as the Put would have.
func fsInterrupt(tb testing.TB, f *blobstore.FS, key string, data []byte, sum string) ([]string, func(testing.TB)) {
	tb.Helper()
	target, err := f.Path(key)
	if err != nil {
		tb.Fatal(err)
	}
	dir, base := filepath.Split(target)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	object := fsTemp(tb, dir, "."+base+".tmp-*", data)
	old := time.Now().Add(-24 * time.Hour)
	if err := os.Chtimes(object, old, old); err != nil {
		tb.Fatal(err)
	}
	sidecar := fsTemp(tb, dir, "."+base+blobstore.SidecarSuffix+".tmp-*", []byte(sum+"  "+base+"\n"))
	var traces []string
	for _, p := range []string{object, sidecar} {
		rel, _ := filepath.Rel(f.Root(), p)
		traces = append(traces, filepath.ToSlash(rel))
	}
	slices.Sort(traces)
	return traces, func(tb testing.TB) {
		tb.Helper()
		if err := os.Rename(sidecar, target+blobstore.SidecarSuffix); err != nil {
			tb.Fatal(err)
		}
		if err := os.Rename(object, target); err != nil {
			tb.Fatal(err)
		}
	}
}

// fsTemp writes data to a new file in dir named after pattern.
func fsTemp(tb testing.TB, dir, pattern string, data []byte) string {
	tb.Helper()
	file, err := os.CreateTemp(dir, pattern)
	if err != nil {
		tb.Fatal(err)
	}
	defer file.Close()
	if _, err := file.Write(data); err != nil {
		tb.Fatal(err)
	}
	return file.Name()
}

// names lists a directory.
func names(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// TestFSLayout: an object is a file at its key's path beside a sidecar in
// sha256sum's format, and Delete removes both.
func TestFSLayout(t *testing.T) {
	ctx := context.Background()
	f, root := newFS(t)
	data, sum := randomBytes(100000, 2)
	key := blobstore.ArtifactKey("tc", "art1")
	if err := f.Put(ctx, key, bytes.NewReader(data), int64(len(data)), sum); err != nil {
		t.Fatalf("Put: %v", err)
	}
	if got, want := names(t, filepath.Join(root, "tc")), []string{"art1.ext4", "art1.ext4.sha256"}; !slices.Equal(got, want) {
		t.Errorf("directory after Put = %v; want %v", got, want)
	}
	got, err := os.ReadFile(filepath.Join(root, "tc", "art1.ext4"))
	if err != nil || !bytes.Equal(got, data) {
		t.Errorf("stored content differs from the source (%v)", err)
	}
	if side, _ := os.ReadFile(filepath.Join(root, "tc", "art1.ext4.sha256")); string(side) != sum+"  art1.ext4\n" {
		t.Errorf("sidecar = %q; want sha256sum format", side)
	}
	if p, err := f.Path(key); err != nil || p != filepath.Join(root, "tc", "art1.ext4") {
		t.Errorf("Path = %q, %v", p, err)
	}
	if err := f.Delete(ctx, key); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if got := names(t, filepath.Join(root, "tc")); len(got) != 0 {
		t.Errorf("directory after Delete = %v", got)
	}
}

func TestFSPutFileLinksOnSameFilesystem(t *testing.T) {
	ctx := context.Background()
	f, root := newFS(t)
	data, sum := randomBytes(4096, 6)
	src := filepath.Join(filepath.Dir(root), "published.ext4")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // the second PutFile finds the same inode in place
		if err := f.PutFile(ctx, "a.ext4", src, int64(len(data)), sum); err != nil {
			t.Fatalf("PutFile #%d: %v", i+1, err)
		}
	}
	srcInfo, _ := os.Stat(src)
	dstInfo, err := os.Stat(filepath.Join(root, "a.ext4"))
	if err != nil || !os.SameFile(srcInfo, dstInfo) {
		t.Errorf("stored file is not a hard link of the source (%v)", err)
	}
	if got, want := names(t, root), []string{"a.ext4", "a.ext4.sha256"}; !slices.Equal(got, want) {
		t.Errorf("root after PutFile = %v; want %v", got, want)
	}
	if info, err := f.Stat(ctx, "a.ext4"); err != nil || info.SHA256 != sum || info.Size != 4096 {
		t.Errorf("Stat = %+v, %v", info, err)
	}
}

func TestFSPutFileCopiesAcrossFilesystems(t *testing.T) {
	ctx := context.Background()
	f, root := newFS(t)
	shm, err := os.MkdirTemp("/dev/shm", "blobstore-test-")
	if err != nil {
		t.Fatalf("need a tmpfs at /dev/shm for a second filesystem: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(shm) })
	data, sum := randomBytes(4096, 7)
	src := filepath.Join(shm, "published.ext4")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := f.PutFile(ctx, "a.ext4", src, int64(len(data)), sum); err != nil {
		t.Fatalf("PutFile across filesystems: %v", err)
	}
	srcInfo, _ := os.Stat(src)
	dstInfo, _ := os.Stat(filepath.Join(root, "a.ext4"))
	if os.SameFile(srcInfo, dstInfo) {
		t.Fatal("source and store on different filesystems share an inode: the test needs two filesystems")
	}
	if got, _ := os.ReadFile(filepath.Join(root, "a.ext4")); !bytes.Equal(got, data) {
		t.Error("copied content differs")
	}
	_, other := randomBytes(4096, 8)
	if err := f.PutFile(ctx, "b.ext4", src, 4096, other); !errors.Is(err, blobstore.ErrChecksumMismatch) {
		t.Errorf("copying PutFile with a wrong sha256 = %v; want ErrChecksumMismatch", err)
	}
	if got, want := names(t, root), []string{"a.ext4", "a.ext4.sha256"}; !slices.Equal(got, want) {
		t.Errorf("root after PutFile = %v; want %v", got, want)
	}
}

// TestFSRejectsReservedKeys: the names FS keeps for its temporary files
// (dot names) and sidecars are no keys on fs, though they are on S3.
func TestFSRejectsReservedKeys(t *testing.T) {
	ctx := context.Background()
	f, root := newFS(t)
	data, sum := randomBytes(10, 1)
	for _, key := range []string{".hidden.ext4", "a/.hidden.ext4", "x.ext4.sha256"} {
		if err := f.Put(ctx, key, bytes.NewReader(data), 10, sum); !errors.Is(err, blobstore.ErrInvalidKey) {
			t.Errorf("Put(%q) = %v; want ErrInvalidKey", key, err)
		}
		if _, err := f.Stat(ctx, key); !errors.Is(err, blobstore.ErrInvalidKey) {
			t.Errorf("Stat(%q) = %v; want ErrInvalidKey", key, err)
		}
		if err := f.Delete(ctx, key); !errors.Is(err, blobstore.ErrInvalidKey) {
			t.Errorf("Delete(%q) = %v; want ErrInvalidKey", key, err)
		}
	}
	if got := names(t, root); len(got) != 0 {
		t.Errorf("files appeared in the root: %v", got)
	}
}

func TestOpen(t *testing.T) {
	if s, err := blobstore.Open(blobstore.Options{}); s != nil || err != nil {
		t.Errorf("Open(no backend) = %v, %v; want nil, nil", s, err)
	}
	root := t.TempDir()
	if s, err := blobstore.Open(blobstore.Options{Backend: "fs", FSRoot: root}); err != nil || s.Backend() != "fs" {
		t.Errorf("Open(fs) = %v, %v", s, err)
	}
	if _, err := blobstore.Open(blobstore.Options{Backend: "fs", FSRoot: "relative"}); err == nil {
		t.Error("Open(fs) accepted a relative root")
	}
	s3 := blobstore.S3Options{Endpoint: "127.0.0.1:9", Bucket: "b", AccessKeyID: "k", SecretAccessKey: "s"}
	if s, err := blobstore.Open(blobstore.Options{Backend: "s3", S3: s3}); err != nil || s.Backend() != "s3" {
		t.Errorf("Open(s3) = %v, %v", s, err)
	}
	s3.PartSize = 1 << 20
	if _, err := blobstore.Open(blobstore.Options{Backend: "s3", S3: s3}); err == nil {
		t.Error("Open(s3) accepted a 1 MiB part size")
	}
	if _, err := blobstore.Open(blobstore.Options{Backend: "gcs"}); err == nil {
		t.Error("Open accepted an unknown backend")
	}
}

// TestFSRootUncreatableNamesRoot: a root below a regular file is refused
// with an error naming the root itself, not only the ancestor mkdir
// tripped on.
func TestFSRootUncreatableNamesRoot(t *testing.T) {
	file := filepath.Join(t.TempDir(), "plain-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(file, "a", "root")
	_, err := blobstore.NewFS(root)
	if err == nil {
		t.Fatalf("NewFS(%s) succeeded below a regular file", root)
	}
	if !strings.Contains(err.Error(), root) {
		t.Errorf("NewFS(%s) = %v; want the error to name the root", root, err)
	}
}
