package ext4

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
)

// Xattr on-disk constants.
const (
	xattrMagic      = 0xEA020000
	xattrHeaderLen  = 32                            // block header
	xattrIbodyStart = inodeGoodOldSize + extraIsize // offset of the ibody header
	xattrIbodySpace = inodeSize - xattrIbodyStart - 4
	xattrRefMax     = 1024 // EXT4_XATTR_REFCOUNT_MAX
)

// Name indexes.
const (
	xiUser       = 1
	xiACLAccess  = 2
	xiACLDefault = 3
	xiTrusted    = 4
	xiSecurity   = 6
	xiSystem     = 7
)

type xentry struct {
	index uint8
	name  []byte
	value []byte
}

func (e *xentry) entryLen() int { return (len(e.name) + 16 + 3) &^ 3 }
func (e *xentry) valueLen() int { return (len(e.value) + 3) &^ 3 }

// xattrBlock is one external xattr block, shared by up to xattrRefMax
// inodes with identical attributes.
type xattrBlock struct {
	data   []byte // checksum filled in at write time
	refs   uint32
	block  uint64
	placed bool
}

// parseXattrs maps names to indexes, converts POSIX ACLs to ext4's disk
// format and sorts entries as the kernel expects (index, name length, name).
func parseXattrs(path string, xs []Xattr) ([]xentry, error) {
	out := make([]xentry, 0, len(xs))
	for _, x := range xs {
		e := xentry{value: x.Value}
		var suffix string
		switch {
		case x.Name == "system.posix_acl_access":
			e.index = xiACLAccess
		case x.Name == "system.posix_acl_default":
			e.index = xiACLDefault
		case strings.HasPrefix(x.Name, "user."):
			e.index, suffix = xiUser, x.Name[len("user."):]
		case strings.HasPrefix(x.Name, "trusted."):
			e.index, suffix = xiTrusted, x.Name[len("trusted."):]
		case strings.HasPrefix(x.Name, "security."):
			e.index, suffix = xiSecurity, x.Name[len("security."):]
		case strings.HasPrefix(x.Name, "system."):
			e.index, suffix = xiSystem, x.Name[len("system."):]
			if suffix == "data" {
				return nil, invalid(path, "xattr %q is reserved for inline data", x.Name)
			}
		default:
			return nil, invalid(path, "xattr %q has an unknown prefix", x.Name)
		}
		if e.index != xiACLAccess && e.index != xiACLDefault && suffix == "" {
			return nil, invalid(path, "xattr %q has an empty name", x.Name)
		}
		if len(suffix) > 255 {
			return nil, invalid(path, "xattr %q name is longer than 255 bytes", x.Name)
		}
		if strings.IndexByte(suffix, 0) >= 0 {
			return nil, invalid(path, "xattr %q name contains NUL", x.Name)
		}
		e.name = []byte(suffix)
		if e.index == xiACLAccess || e.index == xiACLDefault {
			v, err := aclToDisk(x.Value)
			if err != nil {
				return nil, invalid(path, "xattr %q: %v", x.Name, err)
			}
			e.value = v
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b xentry) int {
		return cmp.Or(cmp.Compare(a.index, b.index), cmp.Compare(len(a.name), len(b.name)), bytes.Compare(a.name, b.name))
	})
	for i := 1; i < len(out); i++ {
		if out[i].index == out[i-1].index && bytes.Equal(out[i].name, out[i-1].name) {
			return nil, invalid(path, "duplicate xattr %q (index %d)", out[i].name, out[i].index)
		}
	}
	return out, nil
}

// POSIX ACL tags.
const (
	aclUserObj  = 0x01
	aclUser     = 0x02
	aclGroupObj = 0x04
	aclGroup    = 0x08
	aclMask     = 0x10
	aclOther    = 0x20
)

// aclToDisk converts a POSIX ACL from the generic xattr format (version 2,
// 8-byte entries) to ext4's format (version 1, short entries without id).
func aclToDisk(v []byte) ([]byte, error) {
	if len(v) < 4 || (len(v)-4)%8 != 0 {
		return nil, errorf("ACL of %d bytes is malformed", len(v))
	}
	if ver := binary.LittleEndian.Uint32(v); ver != 2 {
		return nil, errorf("ACL version %d, want 2", ver)
	}
	out := binary.LittleEndian.AppendUint32(nil, 1)
	for p := v[4:]; len(p) > 0; p = p[8:] {
		tag := binary.LittleEndian.Uint16(p)
		out = append(out, p[0:4]...)
		switch tag {
		case aclUserObj, aclGroupObj, aclMask, aclOther:
		case aclUser, aclGroup:
			out = append(out, p[4:8]...)
		default:
			return nil, errorf("unknown ACL tag %#x", tag)
		}
	}
	return out, nil
}

// splitXattrs puts entries in the inode body while they fit, in sorted
// order, and the rest in one external block.
func splitXattrs(es []xentry) (ibody, block []xentry) {
	used := 0
	for _, e := range es {
		if n := e.entryLen() + e.valueLen(); used+n+4 <= xattrIbodySpace {
			ibody = append(ibody, e)
			used += n
		} else {
			block = append(block, e)
		}
	}
	return ibody, block
}

func xattrHash(e *xentry) uint32 {
	var h uint32
	for _, c := range e.name {
		h = (h << 5) ^ (h >> 27) ^ uint32(c)
	}
	if len(e.value) > 0 {
		padded := make([]byte, e.valueLen())
		copy(padded, e.value)
		for i := 0; i < len(padded); i += 4 {
			h = (h << 16) ^ (h >> 16) ^ binary.LittleEndian.Uint32(padded[i:])
		}
	}
	return h
}

// encodeXattrs lays out entries from the start of area and their values
// from its end; offsets are relative to base. It reports false when they
// do not fit. Entry hashes are written when withHash is set.
func encodeXattrs(area []byte, base int, es []xentry, withHash bool) ([]uint32, bool) {
	pos := 0
	end := len(area)
	hashes := make([]uint32, len(es))
	for i := range es {
		e := &es[i]
		if pos+e.entryLen()+4 > end-e.valueLen() {
			return nil, false
		}
		end -= e.valueLen()
		var offs int
		if len(e.value) > 0 {
			copy(area[end:], e.value)
			offs = end + base
		}
		area[pos] = uint8(len(e.name))
		area[pos+1] = e.index
		binary.LittleEndian.PutUint16(area[pos+2:], uint16(offs))
		binary.LittleEndian.PutUint32(area[pos+4:], 0)
		binary.LittleEndian.PutUint32(area[pos+8:], uint32(len(e.value)))
		if withHash {
			hashes[i] = xattrHash(e)
		}
		binary.LittleEndian.PutUint32(area[pos+12:], hashes[i])
		copy(area[pos+16:], e.name)
		pos += e.entryLen()
	}
	return hashes, true
}

// ibodyXattrs encodes the in-inode area that follows i_extra_isize.
func ibodyXattrs(es []xentry) []byte {
	if len(es) == 0 {
		return nil
	}
	b := make([]byte, inodeSize-xattrIbodyStart)
	binary.LittleEndian.PutUint32(b, xattrMagic)
	// Offsets count from the first entry; the kernel leaves e_hash 0 here.
	if _, ok := encodeXattrs(b[4:], 0, es, false); !ok {
		return nil
	}
	return b
}

// blockXattrs encodes an external xattr block (checksum left zero).
func blockXattrs(es []xentry) ([]byte, bool) {
	b := make([]byte, BlockSize)
	binary.LittleEndian.PutUint32(b, xattrMagic)
	binary.LittleEndian.PutUint32(b[8:], 1) // h_blocks
	hashes, ok := encodeXattrs(b[xattrHeaderLen:], xattrHeaderLen, es, true)
	if !ok {
		return nil, false
	}
	var h uint32
	for _, eh := range hashes {
		if eh == 0 {
			h = 0
			break
		}
		h = (h << 16) ^ (h >> 16) ^ eh
	}
	binary.LittleEndian.PutUint32(b[12:], h)
	return b, true
}

// finishXattrBlock sets the reference count and checksum of a placed block.
func finishXattrBlock(xb *xattrBlock, fsSeed uint32) {
	b := xb.data
	binary.LittleEndian.PutUint32(b[4:], xb.refs)
	binary.LittleEndian.PutUint32(b[16:], 0)
	var nr [8]byte
	binary.LittleEndian.PutUint64(nr[:], xb.block)
	c := crc32c(fsSeed, nr[:])
	c = crc32c(c, b)
	binary.LittleEndian.PutUint32(b[16:], c)
}

// CheckXattrs reports whether xs can be stored on one inode, in the inode
// body and at most one xattr block, the way Finish lays them out. Callers
// check attributes as they arrive, so an image cannot hold more of them in
// memory than the filesystem could ever store.
func CheckXattrs(xs []Xattr) error {
	if len(xs) == 0 {
		return nil
	}
	es, err := parseXattrs("", xs)
	if err != nil {
		return err
	}
	_, block := splitXattrs(es)
	used := xattrHeaderLen + 4 // the block header and the end marker
	for i := range block {
		used += block[i].entryLen() + block[i].valueLen()
	}
	if used > BlockSize {
		total := 0
		for _, x := range xs {
			total += len(x.Name) + len(x.Value)
		}
		return fmt.Errorf("%d extended attributes of %d bytes do not fit in the inode and one %d-byte block", len(xs), total, BlockSize)
	}
	return nil
}
