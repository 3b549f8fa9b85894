package ext4

import (
	"bytes"
	"slices"
	"testing"
	"unsafe"
)

// TestNodeSize pins the size of a Node: a tree holds one per file, and 112
// bytes is an allocator size class (the next is 128).
func TestNodeSize(t *testing.T) {
	if got := unsafe.Sizeof(Node{}); got > 112 {
		t.Errorf("unsafe.Sizeof(Node{}) = %d, want at most 112", got)
	}
	if got := unsafe.Sizeof(nodeExtra{}); got > extraAlloc {
		t.Errorf("unsafe.Sizeof(nodeExtra{}) = %d, more than extraAlloc (%d)", got, extraAlloc)
	}
}

func TestNodeExtras(t *testing.T) {
	t.Run("ZeroNode", func(t *testing.T) {
		n := &Node{Mode: ModeRegular | 0o644}
		if got := n.LinkTarget(); got != nil {
			t.Errorf("LinkTarget() = %q, want nil", got)
		}
		if maj, mnr := n.Device(); maj != 0 || mnr != 0 {
			t.Errorf("Device() = %d, %d, want 0, 0", maj, mnr)
		}
		if got := n.Xattrs(); got != nil {
			t.Errorf("Xattrs() = %v, want nil", got)
		}
		if got := n.ExtraMemory(); got != 0 {
			t.Errorf("ExtraMemory() = %d, want 0", got)
		}
	})

	t.Run("EmptySettersDoNotAllocate", func(t *testing.T) {
		n := &Node{Mode: ModeRegular | 0o644}
		allocs := testing.AllocsPerRun(100, func() {
			n.SetLinkTarget(nil)
			n.SetLinkTarget([]byte{})
			n.SetDevice(0, 0)
			n.SetXattrs(nil)
			n.SetXattrs([]Xattr{})
		})
		if allocs != 0 {
			t.Errorf("empty setters made %v allocations, want 0", allocs)
		}
		if n.extra != nil || n.ExtraMemory() != 0 {
			t.Errorf("empty setters left extras %+v (ExtraMemory %d), want none", n.extra, n.ExtraMemory())
		}
	})

	t.Run("SetAndGet", func(t *testing.T) {
		n := &Node{Mode: ModeSymlink | 0o777}
		xs := []Xattr{{Name: "user.a", Value: []byte("b")}}
		n.SetLinkTarget([]byte("../target"))
		n.SetDevice(8, 70000)
		n.SetXattrs(xs)
		if got := n.LinkTarget(); !bytes.Equal(got, []byte("../target")) {
			t.Errorf("LinkTarget() = %q, want %q", got, "../target")
		}
		if maj, mnr := n.Device(); maj != 8 || mnr != 70000 {
			t.Errorf("Device() = %d, %d, want 8, 70000", maj, mnr)
		}
		if got := n.Xattrs(); !slices.EqualFunc(got, xs, func(a, b Xattr) bool { return a.Name == b.Name && bytes.Equal(a.Value, b.Value) }) {
			t.Errorf("Xattrs() = %v, want %v", got, xs)
		}
		if got := n.ExtraMemory(); got != extraAlloc {
			t.Errorf("ExtraMemory() = %d, want %d", got, extraAlloc)
		}

		// Clearing one leaves the others; clearing all frees the extras.
		n.SetDevice(0, 0)
		if got := n.LinkTarget(); !bytes.Equal(got, []byte("../target")) {
			t.Errorf("after SetDevice(0, 0): LinkTarget() = %q, want %q", got, "../target")
		}
		if got := n.Xattrs(); len(got) != 1 {
			t.Errorf("after SetDevice(0, 0): Xattrs() = %v, want one", got)
		}
		n.SetXattrs(nil)
		if n.extra == nil {
			t.Fatal("after SetXattrs(nil): extras freed while the link target is set")
		}
		n.SetLinkTarget(nil)
		if n.extra != nil || n.ExtraMemory() != 0 {
			t.Errorf("after clearing all: extras %+v (ExtraMemory %d), want none", n.extra, n.ExtraMemory())
		}
	})

	t.Run("Constructors", func(t *testing.T) {
		l := NewSymlink([]byte("motd"))
		if l.Mode != ModeSymlink|0o777 || string(l.LinkTarget()) != "motd" {
			t.Errorf("NewSymlink(motd): mode %#o target %q, want %#o %q", l.Mode, l.LinkTarget(), ModeSymlink|0o777, "motd")
		}
		d := NewDevice(ModeBlock|0o660, 8, 1)
		if maj, mnr := d.Device(); d.Mode != ModeBlock|0o660 || maj != 8 || mnr != 1 {
			t.Errorf("NewDevice(block 0660, 8, 1): mode %#o device %d:%d", d.Mode, maj, mnr)
		}
	})
}
