package flatten

import (
	"fmt"
	"unsafe"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"
)

// Limits bound what layers may make a Tree hold, checked entry by entry as
// layers are applied, so a crafted layer fails fast instead of exhausting
// memory. A zero field means no limit.
type Limits struct {
	// MaxEntries bounds the tar entries applied over all layers, whiteouts
	// included.
	MaxEntries int64
	// MaxMemory bounds the estimated memory of the tree and of the ext4
	// metadata planned from it (see EntryMemory).
	MaxMemory int64
}

// Limits every image has, whatever the configuration: what Linux and ext4
// can represent at all.
const (
	// MaxPathLen is the longest entry name accepted (PATH_MAX - 1).
	MaxPathLen = 4095
	// MaxDepth is the most components an entry name may have.
	MaxDepth = 1024
	// MaxReadFile is the largest image file ReadFile reads into memory
	// (CA bundles hold a few hundred KiB).
	MaxReadFile = 16 << 20
)

// EntryMemory is the estimated memory one inode costs from the moment its
// tar entry is applied until the image is finished: its node in the tree,
// the directory entry naming it, and what the ext4 writer plans for it.
// Names, link targets and xattrs add their length on top, and a node with
// any of them the allocation holding them (ext4.Node.ExtraMemory). It
// follows BenchmarkManyFilesMemory's peak resident memory per entry, the
// garbage collector's overhead included, from above (docs/performance.md,
// decision 7, has the numbers).
const EntryMemory = int64(unsafe.Sizeof(ext4.Node{})) + 540

// linkMemory is the estimated memory of one more hard link to an inode.
const linkMemory = 64

// LimitError reports that an image exceeded one of its limits.
type LimitError struct {
	// Limit names the setting, as operators know it.
	Limit string
	// Max is the limit's value.
	Max int64
	// What says what exceeded it.
	What string
}

// Error implements error.
func (e *LimitError) Error() string {
	return fmt.Sprintf("%s exceeds %s (%d)", e.What, e.Limit, e.Max)
}

// Names of the limits in LimitError, as the agent's configuration calls
// them.
const (
	LimitEntries = "build.max_entries"
	LimitMemory  = "build.max_tree_memory"
)

// charge adds the cost of new content to the tree's memory estimate and
// fails once it passes the limit.
func (t *Tree) charge(cost int64) error {
	t.memory += cost
	if t.opts.Grow != nil && t.memory >= t.grown+GrowStep {
		t.grown = t.memory
		t.opts.Grow(t.memory)
	}
	if max := t.opts.Limits.MaxMemory; max > 0 && t.memory > max {
		return &LimitError{Limit: LimitMemory, Max: max, What: fmt.Sprintf("the image's file tree (about %d bytes of memory)", t.memory)}
	}
	return nil
}

// refund takes the cost of removed content off the estimate.
func (t *Tree) refund(cost int64) { t.memory -= cost }

// nodeCost is the estimated memory of n named name, without its subtree.
func nodeCost(name string, n *ext4.Node) int64 {
	c := EntryMemory + n.ExtraMemory() + int64(len(name)) + int64(len(n.LinkTarget()))
	for _, x := range n.Xattrs() {
		c += int64(len(x.Name)+len(x.Value)) + int64(unsafe.Sizeof(x))
	}
	return c
}

// Memory is the tree's current memory estimate, in bytes.
func (t *Tree) Memory() int64 { return t.memory }
