package startcheck

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// glibc's /etc/ld.so.cache (elf/cache.c, sysdeps/generic/dl-cache.h).
// ldconfig writes the new format ("glibc-ld.so.cache1.1") alone since
// glibc 2.32; before, after an old-format table ("ld.so-1.7.0") whose
// entries the loader reads only when no new table follows.
const (
	ldCacheMagicOld = "ld.so-1.7.0"
	ldCacheMagicNew = "glibc-ld.so.cache1.1"
	// ldCacheHeaderOld is sizeof(struct cache_file): the magic, padding,
	// nlibs.
	ldCacheHeaderOld = 16
	ldCacheEntryOld  = 12
	// ldCacheHeaderNew is sizeof(struct cache_file_new): magic and
	// version, nlibs, len_strings, flags, padding, extension_offset,
	// unused.
	ldCacheHeaderNew = 48
	ldCacheEntryNew  = 24
	// ldCacheAlign is the alignment of the new table after an old one
	// (that of struct cache_file_new, which holds a uint64).
	ldCacheAlign = 8
	// ldCacheHwcapExtension marks a new entry's hwcap as naming a
	// glibc-hwcaps subdirectory (x86-64-v3...), which the loader uses
	// only on a CPU that has what it names.
	ldCacheHwcapExtension = 1 << 62
	// ldCacheFlagTypeELFLibc6 is FLAG_ELF_LIBC6 in the type bits
	// (FLAG_TYPE_MASK 0xff).
	ldCacheFlagTypeELFLibc6 = 0x0003
)

// ldCacheEntry is one library of the cache.
type ldCacheEntry struct {
	name, path string
	flags      int32
	hwcap      uint64 // new format only
}

// parseLDCache parses the cache file in b as the loader reads it: the new
// table when there is one (alone, or after the old table), else the old
// one. String offsets are from the start of the new table, or of the old
// table's strings.
func parseLDCache(b []byte) ([]ldCacheEntry, error) {
	if bytes.HasPrefix(b, []byte(ldCacheMagicNew)) {
		return parseLDCacheNew(b)
	}
	if !bytes.HasPrefix(b, []byte(ldCacheMagicOld)) {
		return nil, errors.New("neither glibc's new nor its old cache format")
	}
	if len(b) < ldCacheHeaderOld {
		return nil, errors.New("truncated header")
	}
	// Both formats are written in the byte order of the machine, and
	// only the new one says which it is: the number of entries must fit
	// the file in one of them.
	order := orderFitting(b[12:16], len(b)-ldCacheHeaderOld, ldCacheEntryOld)
	if order == nil {
		return nil, errors.New("more entries than the file holds")
	}
	n := int(order.Uint32(b[12:]))
	end := ldCacheHeaderOld + n*ldCacheEntryOld
	if newAt := (end + ldCacheAlign - 1) &^ (ldCacheAlign - 1); newAt < len(b) && bytes.HasPrefix(b[newAt:], []byte(ldCacheMagicNew)) {
		return parseLDCacheNew(b[newAt:])
	}
	strs := b[end:]
	out := make([]ldCacheEntry, 0, n)
	for i := range n {
		e := b[ldCacheHeaderOld+i*ldCacheEntryOld:]
		name, err1 := cacheString(strs, order.Uint32(e[4:]))
		p, err2 := cacheString(strs, order.Uint32(e[8:]))
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("entry %d: %w", i, err)
		}
		out = append(out, ldCacheEntry{name: name, path: p, flags: int32(order.Uint32(e))})
	}
	return out, nil
}

// parseLDCacheNew parses a new-format table at the start of b.
func parseLDCacheNew(b []byte) ([]ldCacheEntry, error) {
	if len(b) < ldCacheHeaderNew {
		return nil, errors.New("truncated header")
	}
	// flags & 3: 0 unknown (written before glibc 2.32 set it), 1 invalid,
	// 2 little-endian, 3 big-endian.
	var order binary.ByteOrder
	switch b[28] & 3 {
	case 2:
		order = binary.LittleEndian
	case 3:
		order = binary.BigEndian
	case 0:
		order = orderFitting(b[20:24], len(b)-ldCacheHeaderNew, ldCacheEntryNew)
	}
	if order == nil {
		return nil, fmt.Errorf("byte order flag %d or entry count does not fit", b[28]&3)
	}
	n := uint64(order.Uint32(b[20:]))
	if n > uint64(len(b)-ldCacheHeaderNew)/ldCacheEntryNew {
		return nil, errors.New("more entries than the file holds")
	}
	out := make([]ldCacheEntry, 0, n)
	for i := range int(n) {
		e := b[ldCacheHeaderNew+i*ldCacheEntryNew:]
		name, err1 := cacheString(b, order.Uint32(e[4:]))
		p, err2 := cacheString(b, order.Uint32(e[8:]))
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("entry %d: %w", i, err)
		}
		out = append(out, ldCacheEntry{name: name, path: p, flags: int32(order.Uint32(e)), hwcap: order.Uint64(e[16:])})
	}
	return out, nil
}

// orderFitting returns the byte order in which the count in b, of
// entries of size bytes, fits in room bytes; little-endian when both do.
func orderFitting(b []byte, room, size int) binary.ByteOrder {
	for _, o := range []binary.ByteOrder{binary.LittleEndian, binary.BigEndian} {
		if uint64(o.Uint32(b)) <= uint64(max(room, 0))/uint64(size) {
			return o
		}
	}
	return nil
}

// cacheString is the NUL-terminated string at off in b.
func cacheString(b []byte, off uint32) (string, error) {
	if uint64(off) >= uint64(len(b)) {
		return "", fmt.Errorf("string offset %d beyond the file", off)
	}
	s, _, ok := bytes.Cut(b[off:], []byte{0})
	if !ok {
		return "", fmt.Errorf("string at %d without its NUL", off)
	}
	if len(s) > pathMax {
		return "", fmt.Errorf("string at %d longer than %d bytes", off, pathMax)
	}
	return string(s), nil
}

// ldCache is the cache as one architecture's loader reads it: the
// library path for a name.
type ldCache map[string]string

// newLDCache keeps, for each name, the first entry the loader for
// machine accepts: flags of its ABI (flagsOK) and no glibc-hwcaps
// subdirectory, or one only when the name has no plain entry.
func newLDCache(entries []ldCacheEntry, flagsOK func(int32) bool) ldCache {
	c := make(ldCache, len(entries))
	hwcaps := make(map[string]string)
	for _, e := range entries {
		if !flagsOK(e.flags) || e.path == "" {
			continue
		}
		if e.hwcap != 0 {
			if _, ok := hwcaps[e.name]; !ok {
				hwcaps[e.name] = e.path
			}
			continue
		}
		if _, ok := c[e.name]; !ok {
			c[e.name] = e.path
		}
	}
	for name, p := range hwcaps {
		if _, ok := c[name]; !ok {
			c[name] = p
		}
	}
	return c
}
