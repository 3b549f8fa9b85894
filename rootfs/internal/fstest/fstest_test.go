package fstest

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
)

func TestMemStore(t *testing.T) {
	ctx := context.Background()
	s := NewMemStore()
	content, _ := io.ReadAll(imagetest.Sparse("x", 3*storeBlock+5, imagetest.SparsePAX, imagetest.Fragment{Offset: storeBlock + 1, Data: []byte("data")}).Content())
	d, err := s.WriteData(ctx, bytes.NewReader(content), int64(len(content)))
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(s.OpenData(d, int64(len(content))))
	if err != nil || !bytes.Equal(got, content) {
		t.Errorf("OpenData = %d bytes, %v; want the %d bytes written", len(got), err, len(content))
	}
	if _, err := s.WriteData(ctx, strings.NewReader("short"), 10); err == nil {
		t.Error("WriteData accepted a short reader")
	}
	s.Release(d)
	s.Release(d)
	if len(s.Live()) != 0 || s.Released() != 1 || len(s.Misuse()) != 1 {
		t.Errorf("after a double release: live %v, released %d, misuse %v", s.Live(), s.Released(), s.Misuse())
	}
}
