package ext4

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
)

// testTime is a fixed timestamp with nanoseconds.
var testTime = time.Unix(1700000000, 123456789)

func testOptions() Options {
	return Options{
		UUID:              [16]byte{0x8c, 0x1e, 0x3a, 0x55, 0x21, 0x4b, 0x4d, 0x1c, 0x9b, 0x2d, 0x6e, 0x0f, 0x77, 0x10, 0xaa, 0x01},
		HashSeed:          [16]byte{0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff, 0x01},
		Label:             "test",
		Time:              testTime,
		HeadroomPercent:   10,
		HeadroomMinBlocks: 256,
		HeadroomInodes:    64,
	}
}

// image is one image under construction in a test.
type image struct {
	t    testing.TB
	path string
	f    *os.File
	w    *Writer
}

func newImage(t testing.TB, opts Options) *image {
	t.Helper()
	return newImageAt(t, filepath.Join(t.TempDir(), "fs.ext4"), opts)
}

func newImageAt(t testing.TB, path string, opts Options) *image {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	w, err := NewWriter(f, opts)
	if err != nil {
		t.Fatalf("NewWriter: %v", err)
	}
	return &image{t: t, path: path, f: f, w: w}
}

// file writes content and returns a regular-file node for it.
func (im *image) file(mode uint32, content []byte) *Node {
	im.t.Helper()
	d, err := im.w.WriteData(context.Background(), bytes.NewReader(content), int64(len(content)))
	if err != nil {
		im.t.Fatalf("WriteData: %v", err)
	}
	return &Node{Mode: ModeRegular | mode, Size: int64(len(content)), Data: d,
		Atime: Nanos(testTime), Mtime: Nanos(testTime), Ctime: Nanos(testTime), Crtime: Nanos(testTime)}
}

func (im *image) finish(root *Node) Stats {
	im.t.Helper()
	st, err := im.w.Finish(context.Background(), root)
	if err != nil {
		im.t.Fatalf("Finish: %v", err)
	}
	fi, err := os.Stat(im.path)
	if err != nil {
		im.t.Fatal(err)
	}
	if fi.Size() != st.Size || st.Size%(2<<20) != 0 {
		im.t.Fatalf("image is %d bytes, Stats.Size %d, want equal and a multiple of 2 MiB", fi.Size(), st.Size)
	}
	return st
}

func dir(children map[string]*Node) *Node {
	return &Node{Mode: ModeDir | 0o755, Children: children, Atime: Nanos(testTime), Mtime: Nanos(testTime), Ctime: Nanos(testTime), Crtime: Nanos(testTime)}
}

// debugfs runs one debugfs request against the image.
func debugfs(t testing.TB, path, req string) string {
	t.Helper()
	cmd := exec.Command(imagetest.Tool(t, "debugfs"), "-R", req, path)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("debugfs -R %q: %v\n%s", req, err, errb.String())
	}
	return out.String()
}

func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for k := 0; k < 8; k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
