package rootfs

import (
	"context"
	"fmt"
	"io"

	"golang.org/x/sys/unix"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/flatten"
)

// Limits bound what one build may take from the host, whatever the image
// holds. Zero fields mean no limit.
type Limits struct {
	// MaxEntries bounds the tar entries of all layers.
	MaxEntries int64
	// MaxTreeMemory bounds the estimated memory of the image's file tree.
	MaxTreeMemory int64
	// MaxImageSize bounds the file content written into the image,
	// overwritten files included, checked before each file is written.
	MaxImageSize int64
	// MinFreeBytes and MinFreePercent (of the filesystem's size) are kept
	// free on the store's filesystem; the larger of the two applies. A
	// build that would write into that reserve fails.
	MinFreeBytes   int64
	MinFreePercent float64
}

// Names of the limits in errors, as the agent's configuration calls them.
const (
	LimitImageSize = "build.max_image_size"
	LimitMinFree   = "store.min_free"
)

// freeCheckEvery is how much content may be written between two checks of
// the store's free space.
const freeCheckEvery = 32 << 20

// guardedStore is the image writer as the tree sees it, with the content
// and free-space limits applied before each write.
type guardedStore struct {
	*ext4.Writer
	dir     string
	limits  Limits
	content int64
	// unchecked is the content written since free space was last checked.
	unchecked int64
}

// WriteData checks the limits for size more bytes, then writes them.
func (g *guardedStore) WriteData(ctx context.Context, r io.Reader, size int64) (ext4.Data, error) {
	if max := g.limits.MaxImageSize; max > 0 && g.content+size > max {
		return ext4.Data{}, &flatten.LimitError{Limit: LimitImageSize, Max: max,
			What: fmt.Sprintf("the image's content (%d bytes with this file)", g.content+size)}
	}
	if g.unchecked+size >= freeCheckEvery {
		if err := g.checkFree(size); err != nil {
			return ext4.Data{}, err
		}
		g.unchecked = 0
	}
	g.content += size
	g.unchecked += size
	return g.Writer.WriteData(ctx, r, size)
}

// checkFree fails when writing more bytes would leave less than the
// reserve free on the store's filesystem.
func (g *guardedStore) checkFree(more int64) error {
	sp, err := StoreSpace(g.dir, g.limits)
	if err != nil {
		return err
	}
	if sp.Reserve > 0 && sp.Free-more < sp.Reserve {
		return &flatten.LimitError{Limit: LimitMinFree, Max: sp.Reserve,
			What: fmt.Sprintf("writing %d more bytes to the store (%d bytes free)", more, sp.Free)}
	}
	return nil
}

// Space describes a filesystem's room, in bytes.
type Space struct {
	// Size is the filesystem's size; Free what an unprivileged writer may
	// still use.
	Size, Free int64
	// Reserve is what the limits keep free (MinFreeBytes or
	// MinFreePercent of Size, the larger).
	Reserve int64
}

// StoreSpace measures the filesystem holding dir and the reserve the
// limits keep free on it.
func StoreSpace(dir string, l Limits) (Space, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return Space{}, fmt.Errorf("check space of %s: %w", dir, err)
	}
	size := int64(st.Blocks) * st.Bsize
	return Space{Size: size, Free: int64(st.Bavail) * st.Bsize,
		Reserve: max(l.MinFreeBytes, int64(float64(size)*l.MinFreePercent/100))}, nil
}
