package startcheck

import (
	"bytes"
	"encoding/binary"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
)

var cacheEntries = []ldCacheEntry{
	{name: "libz.so.1", path: "/lib/x86_64-linux-gnu/libz.so.1", flags: 0x0303},
	{name: "libc.so.6", path: "/lib/x86_64-linux-gnu/libc.so.6", flags: 0x0303},
	{name: "libc.so.6", path: "/lib/i386-linux-gnu/libc.so.6", flags: 0x0003},
	{name: "libfast.so.1", path: "/usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libfast.so.1", flags: 0x0303, hwcap: ldCacheHwcapExtension | 2},
}

func TestParseLDCache(t *testing.T) {
	for _, tc := range []struct {
		name   string
		layout int
		order  binary.ByteOrder
	}{
		{"New", cacheNew, binary.LittleEndian},
		{"NewBigEndian", cacheNew, binary.BigEndian},
		{"Compat", cacheCompat, binary.LittleEndian},
		{"Old", cacheOld, binary.LittleEndian},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseLDCache(mkLDCache(cacheEntries, tc.layout, tc.order))
			if err != nil {
				t.Fatalf("parseLDCache: %v", err)
			}
			want := cacheEntries
			if tc.layout == cacheOld {
				// The old format has no hwcap.
				want = append([]ldCacheEntry(nil), cacheEntries...)
				want[3].hwcap = 0
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("parseLDCache = %+v, want %+v", got, want)
			}
		})
	}
	t.Run("Bad", func(t *testing.T) {
		good := mkLDCache(cacheEntries, cacheNew, binary.LittleEndian)
		manyEntries := append([]byte(nil), good...)
		binary.LittleEndian.PutUint32(manyEntries[20:], 1<<30)
		badString := append([]byte(nil), good...)
		binary.LittleEndian.PutUint32(badString[ldCacheHeaderNew+4:], uint32(len(good)+10))
		for name, b := range map[string][]byte{
			"Empty":       nil,
			"NotACache":   []byte("#!/bin/sh\n"),
			"ShortHeader": good[:30],
			"ManyEntries": manyEntries,
			"BadString":   badString,
			"NoNUL":       good[:len(good)-1],
		} {
			if got, err := parseLDCache(b); err == nil {
				t.Errorf("parseLDCache(%s) = %+v, want an error", name, got)
			}
		}
	})
}

// TestParseHostLDCache parses the host's cache, which ldconfig wrote, and
// finds there what `ldconfig -p` lists.
func TestParseHostLDCache(t *testing.T) {
	b, err := os.ReadFile("/etc/ld.so.cache")
	if err != nil {
		t.Skipf("no host cache: %v", err)
	}
	entries, err := parseLDCache(b)
	if err != nil {
		t.Fatalf("parseLDCache(/etc/ld.so.cache): %v", err)
	}
	out, err := exec.Command("/sbin/ldconfig", "-p").Output()
	if err != nil {
		t.Skipf("ldconfig -p: %v", err)
	}
	// "\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1"
	listed := 0
	for line := range strings.SplitSeq(string(out), "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), " (")
		_, p, ok2 := strings.Cut(rest, " => ")
		if !ok || !ok2 {
			continue
		}
		listed++
		found := false
		for _, e := range entries {
			if e.name == name && e.path == p {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("ldconfig -p lists %s => %s; parseLDCache has no such entry", name, p)
		}
	}
	if listed != len(entries) {
		t.Errorf("ldconfig -p lists %d libraries, parseLDCache found %d", listed, len(entries))
	}
}

// FuzzParseLDCache parses caches shaped by the fuzzer: it returns entries
// or an error, never panics, and its entries' strings are bounded.
func FuzzParseLDCache(f *testing.F) {
	for _, layout := range []int{cacheNew, cacheCompat, cacheOld} {
		f.Add(mkLDCache(cacheEntries, layout, binary.LittleEndian))
	}
	f.Add(mkLDCache(cacheEntries, cacheNew, binary.BigEndian))
	if b, err := os.ReadFile("/etc/ld.so.cache"); err == nil && len(b) < 1<<20 {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		entries, err := parseLDCache(b)
		if err != nil {
			return
		}
		if len(entries)*ldCacheEntryOld > len(b) {
			t.Fatalf("parseLDCache: %d entries from %d bytes", len(entries), len(b))
		}
		for _, e := range entries {
			if len(e.name) > pathMax || len(e.path) > pathMax || strings.ContainsRune(e.name+e.path, 0) {
				t.Fatalf("parseLDCache: entry %q => %q", e.name, e.path)
			}
		}
		newLDCache(entries, func(flags int32) bool { return flags&0xff == ldCacheFlagTypeELFLibc6 })
	})
}

// The layouts of /etc/ld.so.cache ldconfig writes.
const (
	cacheNew    = iota // the new format alone (glibc 2.32 on)
	cacheCompat        // the old format, the new one hidden in its strings
	cacheOld           // the old format alone
)

// mkLDCache writes an /etc/ld.so.cache of entries as ldconfig does, in
// layout (cacheNew, cacheCompat, cacheOld) and byte order.
func mkLDCache(entries []ldCacheEntry, layout int, order binary.ByteOrder) []byte {
	w := func(b *bytes.Buffer, v any) { _ = binary.Write(b, order, v) }
	var strs bytes.Buffer
	keys, vals := make([]uint32, len(entries)), make([]uint32, len(entries))
	for i, e := range entries {
		keys[i] = uint32(strs.Len())
		strs.WriteString(e.name + "\x00")
		vals[i] = uint32(strs.Len())
		strs.WriteString(e.path + "\x00")
	}
	n := len(entries)
	newSize := uint32(ldCacheHeaderNew + n*ldCacheEntryNew)
	oldSize := ldCacheHeaderOld + n*ldCacheEntryOld
	pad := (oldSize+ldCacheAlign-1)&^(ldCacheAlign-1) - oldSize
	var out bytes.Buffer
	if layout != cacheNew {
		// Old offsets count from the end of the old entries; in the
		// compat layout the new table sits there, before the strings.
		skip := uint32(0)
		if layout == cacheCompat {
			skip = uint32(pad) + newSize
		}
		out.WriteString(ldCacheMagicOld + "\x00")
		w(&out, uint32(n))
		for i, e := range entries {
			w(&out, [3]uint32{uint32(e.flags), skip + keys[i], skip + vals[i]})
		}
		if layout == cacheOld {
			out.Write(strs.Bytes())
			return out.Bytes()
		}
		out.Write(make([]byte, pad))
	}
	out.WriteString(ldCacheMagicNew)
	w(&out, uint32(n))
	w(&out, uint32(strs.Len()))
	flag := byte(2)
	if order == binary.BigEndian {
		flag = 3
	}
	out.Write([]byte{flag, 0, 0, 0})
	out.Write(make([]byte, 16)) // extension offset, unused
	for i, e := range entries {
		w(&out, [4]uint32{uint32(e.flags), newSize + keys[i], newSize + vals[i], 0})
		w(&out, e.hwcap)
	}
	out.Write(strs.Bytes())
	return out.Bytes()
}
