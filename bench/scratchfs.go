package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// DefaultScratchSize is the size of the scratch filesystem: room for one
// iteration of the large image (upstream's tree, layout and 1.25 GiB
// scratch image, the agent's cache and images) with margin. The file is
// sparse.
const DefaultScratchSize = 8 << 30

// scratchFS is a journaled ext4 filesystem in a file, loop-mounted (direct
// I/O, so the backing file adds no second page cache): every build runs in
// it. Production stores are journaled filesystems; without a journal, ext4
// skips inodes deleted in the last 60 to 300 seconds when it allocates new
// ones (recently_deleted in fs/ext4/ialloc.c), which slows every tool that
// creates a tree on the host (umoci) after the previous build's tree was
// removed, and would make upstream look worse than it is.
type scratchFS struct {
	// Dir is the mount point.
	Dir   string
	image string
	dev   string
}

// mountScratch makes and mounts a fresh scratch filesystem of size bytes
// at dir, backed by image. Leftovers of an interrupted run at the same
// paths are unmounted and detached first.
func mountScratch(ctx context.Context, image, dir string, size int64) (*scratchFS, error) {
	releaseScratch(image, dir)
	if err := os.Remove(image); err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("scratch filesystem: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("scratch filesystem: %w", err)
	}
	f, err := os.Create(image)
	if err != nil {
		return nil, fmt.Errorf("scratch filesystem: %w", err)
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("scratch filesystem: %w", err)
	}
	// Inode tables and journal are initialized now, not by a kernel thread
	// that would compete with the measurements.
	if _, err := runTool(ctx, nil, "mkfs.ext4", "-F", "-q", "-L", "tcbench", "-E", "lazy_itable_init=0,lazy_journal_init=0", image); err != nil {
		os.Remove(image)
		return nil, fmt.Errorf("scratch filesystem: %w", err)
	}
	out, err := exec.CommandContext(ctx, "losetup", "--find", "--show", "--direct-io=on", image).Output()
	if err != nil {
		os.Remove(image)
		return nil, fmt.Errorf("scratch filesystem: losetup: %w", err)
	}
	s := &scratchFS{Dir: dir, image: image, dev: strings.TrimSpace(string(out))}
	if err := unix.Mount(s.dev, dir, "ext4", 0, ""); err != nil {
		s.Close()
		return nil, fmt.Errorf("scratch filesystem: mount %s: %w", s.dev, err)
	}
	return s, nil
}

// Close unmounts the filesystem, detaches the loop device and removes the
// backing file.
func (s *scratchFS) Close() error {
	var err error
	for i := 0; i < 20; i++ { // a loop mount of a verified image may linger briefly
		if err = unix.Unmount(s.Dir, 0); err == nil || err == unix.EINVAL {
			err = nil
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("unmount scratch filesystem: %w", err)
	}
	if out, derr := exec.Command("losetup", "-d", s.dev).CombinedOutput(); derr != nil {
		return fmt.Errorf("detach %s: %w: %s", s.dev, derr, out)
	}
	return os.Remove(s.image)
}

// releaseScratch unmounts whatever an earlier run left mounted below dir
// and detaches the loop devices backed by image.
func releaseScratch(image, dir string) {
	images.UnmountBelow(dir)
	out, err := exec.Command("losetup", "--associated", image).Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		if dev, _, ok := strings.Cut(line, ":"); ok && strings.HasPrefix(dev, "/dev/loop") {
			exec.Command("losetup", "-d", dev).Run()
		}
	}
}

// scratchPaths are the backing file and mount point under a work
// directory.
func scratchPaths(work string) (image, dir string) {
	return filepath.Join(work, "scratch.ext4"), filepath.Join(work, "builds")
}
