package rootfs_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/rootfs"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/flatten"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/imagetest"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// buildFailsOnLimit builds layers and checks the build fails on the named
// limit (at entry, when given), leaving the store empty.
func buildFailsOnLimit(t *testing.T, b *rootfs.Builder, opts rootfs.Options, reg *images.Registry, name string, layers []imagetest.Layer, entry, limit string) {
	t.Helper()
	ref := reg.Push(t, "limits/"+name+":v1", corpusImage(t, layers))
	img := resolve(t, b, rootfs.Source{Ref: ref})
	art, err := b.Build(context.Background(), specOf(img, ref, nil, nil), nil)
	if err == nil {
		t.Fatalf("Build succeeded (%s), want %s to stop it", art.Path, limit)
	}
	var ee *flatten.EntryError
	var le *flatten.LimitError
	if !errors.As(err, &le) || le.Limit != limit {
		t.Fatalf("Build error = %v, want the %s limit", err, limit)
	}
	if entry != "" && (!errors.As(err, &ee) || ee.Name != entry) {
		t.Errorf("Build error = %v, want it to name entry %q", err, entry)
	}
	if !strings.Contains(err.Error(), limit) {
		t.Errorf("Build error %q does not name %s", err, limit)
	}
	checkStoreEmpty(t, opts.Store)
}

func TestBuildMaxImageSize(t *testing.T) {
	reg := images.StartRegistry(t, nil)
	opts := builderOptions(t, reg.Host)
	opts.Limits.MaxImageSize = 10 << 20
	b := newBuilder(t, opts)
	big := []imagetest.Layer{{imagetest.Blob("a", 4<<20, 1)}, {imagetest.Blob("b", 7<<20, 2)}}
	buildFailsOnLimit(t, b, opts, reg, "big", big, "b", rootfs.LimitImageSize)
	// The same builder goes on building what fits.
	ref := reg.Push(t, "limits/fits:v1", corpusImage(t, []imagetest.Layer{{imagetest.Blob("a", 4<<20, 1)}}))
	buildOK(t, b, opts.Store, rootfs.Source{Ref: ref}, 1, nil, nil)
}

func TestBuildMaxEntriesAndTreeMemory(t *testing.T) {
	reg := images.StartRegistry(t, nil)
	opts := builderOptions(t, reg.Host)
	opts.Limits.MaxEntries = 50
	b := newBuilder(t, opts)
	var many imagetest.Layer
	for i := range 60 {
		many = append(many, imagetest.File("f"+strings.Repeat("x", i), ""))
	}
	buildFailsOnLimit(t, b, opts, reg, "entries", []imagetest.Layer{many}, many[50].Name, flatten.LimitEntries)
	// Two entries 1000 directories deep: the directories the tree creates
	// for them count, past a 1 MiB budget.
	opts.Limits.MaxTreeMemory = 1 << 20
	wide := imagetest.Layer{imagetest.File(strings.Repeat("a/", 1000)+"f", ""), imagetest.File(strings.Repeat("b/", 1000)+"f", "")}
	opts.Pull.CacheDir = t.TempDir()
	b = newBuilder(t, opts)
	buildFailsOnLimit(t, b, opts, reg, "memory", []imagetest.Layer{wide}, "", flatten.LimitMemory)
}

// TestBuildMinFree builds into a 160 MiB store that must keep half of
// itself free: an image of 120 MiB fails before the reserve is reached,
// leaving nothing behind, and a small image still builds.
func TestBuildMinFree(t *testing.T) {
	reg := images.StartRegistry(t, nil)
	opts := builderOptions(t, reg.Host)
	opts.Store = rootfs.Store(imagetest.Tmpfs(t, "160m"))
	opts.Limits.MinFreePercent = 50
	b := newBuilder(t, opts)
	var layers []imagetest.Layer
	for i := range 5 { // 24 MiB each, compressing to almost nothing
		layers = append(layers, imagetest.Layer{imagetest.File("file"+strings.Repeat("x", i), strings.Repeat("abcdefg"+string(rune('0'+i)), 3<<20))})
	}
	buildFailsOnLimit(t, b, opts, reg, "fill", layers, "", rootfs.LimitMinFree)
	ref := reg.Push(t, "limits/small:v1", corpusImage(t, []imagetest.Layer{{imagetest.File("f", "small")}}))
	buildOK(t, b, opts.Store, rootfs.Source{Ref: ref}, 1, nil, nil)
}
