package flatten_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/flatten"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/fstest"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

func TestTimes(t *testing.T) {
	store := fstest.NewMemStore()
	tree := flatten.New(store, flatten.Options{RootTime: imagetest.T3})
	flattenLayers(t, tree, []imagetest.Layer{{
		imagetest.File("times", "t").Times(imagetest.T2, imagetest.T3),
		imagetest.File("plain", "p").At(imagetest.T1),
		imagetest.File("implied/child", "c"),
	}}, images.Uncompressed)
	tests := []struct {
		path                       string
		atime, mtime, ctime, crtim any
	}{
		{"times", imagetest.T2, imagetest.Epoch, imagetest.T3, imagetest.Epoch},
		{"plain", imagetest.T1, imagetest.T1, imagetest.T1, imagetest.T1},
		{"implied", imagetest.T3, imagetest.T3, imagetest.T3, imagetest.T3},
		{".", imagetest.T3, imagetest.T3, imagetest.T3, imagetest.T3},
	}
	for _, tc := range tests {
		n, err := tree.Lookup(tc.path)
		if err != nil {
			t.Fatal(err)
		}
		got := []any{time.Unix(0, n.Atime).UTC(), time.Unix(0, n.Mtime).UTC(), time.Unix(0, n.Ctime).UTC(), time.Unix(0, n.Crtime).UTC()}
		want := []any{tc.atime, tc.mtime, tc.ctime, tc.crtim}
		for i, name := range []string{"atime", "mtime", "ctime", "crtime"} {
			if got[i] != want[i] {
				t.Errorf("%s %s = %v, want %v", tc.path, name, got[i], want[i])
			}
		}
	}
}

// countingReader counts the bytes read through it and whether it hit EOF.
type countingReader struct {
	r   io.Reader
	n   int64
	eof bool
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err == io.EOF {
		c.eof = true
	}
	return n, err
}

func TestApplyLayerReadsToEOF(t *testing.T) {
	raw, err := imagetest.Layer{imagetest.File("f", "x")}.Tar()
	if err != nil {
		t.Fatal(err)
	}
	// Blobs often carry zero padding after the end-of-archive blocks; a
	// digest-verifying reader only checks once it is read to the end.
	r := &countingReader{r: io.MultiReader(bytes.NewReader(raw), bytes.NewReader(make([]byte, 20000)))}
	tree := flatten.New(fstest.NewMemStore(), flatten.Options{})
	if err := tree.ApplyLayer(context.Background(), 0, r); err != nil {
		t.Fatal(err)
	}
	if !r.eof || r.n != int64(len(raw))+20000 {
		t.Errorf("ApplyLayer read %d bytes (EOF %v), want all %d", r.n, r.eof, len(raw)+20000)
	}
}

func TestApplyLayerCanceled(t *testing.T) {
	raw, err := imagetest.Layer{imagetest.File("f", "x")}.Tar()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tree := flatten.New(fstest.NewMemStore(), flatten.Options{})
	if err := tree.ApplyLayer(ctx, 0, bytes.NewReader(raw)); !errors.Is(err, context.Canceled) {
		t.Errorf("ApplyLayer with a canceled context = %v, want context.Canceled", err)
	}
}

func TestApplyLayerStoreError(t *testing.T) {
	raw, err := imagetest.Layer{imagetest.File("a", "a"), imagetest.File("b", "b")}.Tar()
	if err != nil {
		t.Fatal(err)
	}
	tree := flatten.New(&failingStore{MemStore: fstest.NewMemStore(), failAt: 2}, flatten.Options{})
	err = tree.ApplyLayer(context.Background(), 3, bytes.NewReader(raw))
	var ee *flatten.EntryError
	if !errors.As(err, &ee) || ee.Layer != 3 || ee.Name != "b" || !errors.Is(err, errStore) {
		t.Errorf("ApplyLayer = %v, want an EntryError for layer 3 entry \"b\" wrapping %v", err, errStore)
	}
}

func TestApplyLayerTruncated(t *testing.T) {
	raw, err := imagetest.Layer{imagetest.Blob("big", 100000, 1)}.Tar()
	if err != nil {
		t.Fatal(err)
	}
	tree := flatten.New(fstest.NewMemStore(), flatten.Options{})
	err = tree.ApplyLayer(context.Background(), 0, bytes.NewReader(raw[:50000]))
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("ApplyLayer of a truncated layer = %v, want io.ErrUnexpectedEOF", err)
	}
	err = tree.ApplyLayer(context.Background(), 1, bytes.NewReader([]byte("this is not a tar stream at all, just some text padding it out to more than one block"+string(make([]byte, 600)))))
	if err == nil {
		t.Error("ApplyLayer of garbage succeeded")
	}
}

// streamCheckStore checks that file data reaches WriteData while the layer
// is still mostly unread: the tree streams rather than buffers.
type streamCheckStore struct {
	*fstest.MemStore
	src        *countingReader
	atCall     int64
	afterWrite int64
}

func (s *streamCheckStore) WriteData(ctx context.Context, r io.Reader, size int64) (ext4.Data, error) {
	s.atCall = s.src.n
	d, err := s.MemStore.WriteData(ctx, r, size)
	s.afterWrite = s.src.n
	return d, err
}

func TestApplyLayerStreams(t *testing.T) {
	const size = 64 << 20
	raw, err := imagetest.Layer{imagetest.Blob("big", size, 7)}.Tar()
	if err != nil {
		t.Fatal(err)
	}
	src := &countingReader{r: bytes.NewReader(raw)}
	store := &streamCheckStore{MemStore: fstest.NewMemStore(), src: src}
	tree := flatten.New(store, flatten.Options{})
	if err := tree.ApplyLayer(context.Background(), 0, src); err != nil {
		t.Fatal(err)
	}
	if store.atCall >= size/2 {
		t.Errorf("%d of %d bytes were read before WriteData was called: data is buffered", store.atCall, size)
	}
	if store.afterWrite < size {
		t.Errorf("only %d bytes were read when WriteData returned, want at least %d", store.afterWrite, size)
	}
}

func TestEntryError(t *testing.T) {
	inner := errors.New("inner")
	e := &flatten.EntryError{Layer: 2, Name: "a\xffb", Reason: "write data", Err: inner}
	if want := `layer 2: entry "a\xffb": write data: inner`; e.Error() != want {
		t.Errorf("Error() = %q, want %q", e.Error(), want)
	}
	if !errors.Is(e, inner) {
		t.Error("EntryError does not unwrap to its cause")
	}
}
