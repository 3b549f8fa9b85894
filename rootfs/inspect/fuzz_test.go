package inspect

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"
)

// maxFuzzSize bounds the file FuzzOpen makes: enough for the small images
// of its seeds and for what a crafted superblock claims, little enough to
// create quickly (the rest is a hole).
const maxFuzzSize = 64 << 20

// fuzzImage is an image in the form FuzzOpen takes: head at offset 0, body
// at offset at, the file size at least size and the rest holes. The
// writer's images are metadata at the start (superblock, group
// descriptors), reserved zero blocks, then bitmaps, inode table,
// directories and data: head and body hold the non-zero parts, so the
// fuzzer mutates kilobytes, not megabytes.
type fuzzImage struct {
	head []byte
	at   int64
	body []byte
	size int64
}

// writerImage builds a small image of every inode type with this
// project's ext4 writer.
func writerImage(tb testing.TB, journal uint32) fuzzImage {
	tb.Helper()
	ctx := context.Background()
	p := filepath.Join(tb.TempDir(), "img.ext4")
	f, err := os.Create(p)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	w, err := ext4.NewWriter(f, ext4.Options{Time: time.Unix(1700000000, 0), JournalBlocks: journal, NoSync: true})
	if err != nil {
		tb.Fatal(err)
	}
	body := []byte("hello, world\n")
	d, err := w.WriteData(ctx, bytes.NewReader(body), int64(len(body)))
	if err != nil {
		tb.Fatal(err)
	}
	etc := &ext4.Node{Mode: ext4.ModeDir | 0o755, Children: map[string]*ext4.Node{
		"motd":  {Mode: ext4.ModeRegular | 0o644, UID: 1000, GID: 1000, Size: int64(len(body)), Data: d},
		"link":  ext4.NewSymlink([]byte("motd")),
		"null":  ext4.NewDevice(ext4.ModeChar|0o666, 1, 3),
		"fifo":  {Mode: ext4.ModeFIFO | 0o600},
		"empty": {Mode: ext4.ModeRegular | 0o600},
	}}
	root := &ext4.Node{Mode: ext4.ModeDir | 0o755, Children: map[string]*ext4.Node{"etc": etc}}
	if _, err := w.Finish(ctx, root); err != nil {
		tb.Fatal(err)
	}
	raw, err := os.ReadFile(p)
	if err != nil {
		tb.Fatal(err)
	}
	return splitImage(raw)
}

// splitImage cuts raw at its first run of zero blocks after block 0.
func splitImage(raw []byte) fuzzImage {
	const block = 4096
	zero := make([]byte, block)
	img := fuzzImage{size: int64(len(raw))}
	gap := -1
	for b := 1; (b+1)*block <= len(raw); b++ {
		if bytes.Equal(raw[b*block:(b+1)*block], zero) {
			if gap < 0 {
				gap = b
			}
			continue
		}
		if gap >= 0 {
			img.head = bytes.TrimRight(raw[:gap*block], "\x00")
			img.at = int64(b * block)
			img.body = bytes.TrimRight(raw[b*block:], "\x00")
			return img
		}
	}
	img.head = bytes.TrimRight(raw, "\x00")
	return img
}

// file writes the image to a new file under dir.
func (img fuzzImage) file(tb testing.TB, dir string) string {
	tb.Helper()
	p := filepath.Join(dir, "img")
	f, err := os.Create(p)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(img.head); err != nil {
		tb.Fatal(err)
	}
	if _, err := f.WriteAt(img.body, img.at); err != nil {
		tb.Fatal(err)
	}
	if end := img.at + int64(len(img.body)); img.size < end {
		img.size = end
	}
	if err := f.Truncate(max(img.size, int64(len(img.head)))); err != nil {
		tb.Fatal(err)
	}
	return p
}

// FuzzOpen opens arbitrary bytes as an image (head at 0, body at offset
// at, holes up to size; the superblock, group descriptor and inode
// checksums fixed up, see fixChecksums and fixInodeChecksums) and lists, stats and reads what it can. Open,
// List, Stat and ReadFile must never panic or hang: the bytes are checked
// before go-diskfs sees them, and what it still trips over comes back as
// an error.
func FuzzOpen(f *testing.F) {
	for _, journal := range []uint32{0} {
		img := writerImage(f, journal)
		f.Add(img.head, img.at, img.body, img.size)
		f.Add(img.head, img.at, img.body, int64(0))                              // the tail cut off
		f.Add(img.head, img.at, img.body[:len(img.body)/2], int64(0))            // truncated in the inode table
		f.Add(img.head[:min(2048, len(img.head))], int64(0), []byte{}, img.size) // a superblock and holes
	}
	f.Add([]byte{}, int64(0), []byte{}, int64(0))
	f.Fuzz(func(t *testing.T, head []byte, at int64, body []byte, size int64) {
		if at < 0 || size < 0 || at+int64(len(body)) > maxFuzzSize || size > maxFuzzSize {
			return
		}
		head = fixChecksums(head)
		im, err := Open(fuzzImage{head, at, fixInodeChecksums(head, at, body), size}.file(t, t.TempDir()))
		if err != nil {
			return
		}
		defer im.Close()
		walkImage(im, "/", 0)
	})
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// crc32c is ext4's raw CRC32c.
func crc32c(seed uint32, p []byte) uint32 { return ^crc32.Update(^seed, castagnoli, p) }

// fixChecksums returns a copy of head with the superblock checksum and
// the checksum of every group descriptor it holds recomputed. go-diskfs
// verifies both, so without this nearly every mutation of those fields
// stops at a checksum mismatch; a crafted image carries valid checksums.
func fixChecksums(head []byte) []byte {
	out := bytes.Clone(head)
	if len(out) < 2048 {
		return out
	}
	le := binary.LittleEndian
	sb := out[1024:2048]
	seed := crc32c(^uint32(0), sb[0x68:0x78]) // s_uuid
	if le.Uint32(sb[0x60:])&0x2000 != 0 {     // csum_seed
		seed = le.Uint32(sb[0x270:])
	}
	if logBlock := le.Uint32(sb[0x18:]); logBlock <= 6 {
		blockSize := 1024 << logBlock
		descSize := 32
		if le.Uint32(sb[0x60:])&0x80 != 0 { // 64bit
			descSize = int(le.Uint16(sb[0xFE:]))
		}
		gdt := blockSize
		if blockSize == 1024 {
			gdt = 2048
		}
		if descSize >= 0x20 {
			for g := 0; gdt+(g+1)*descSize <= len(out) && g < 1024; g++ {
				d := out[gdt+g*descSize : gdt+(g+1)*descSize]
				var gb [4]byte
				le.PutUint32(gb[:], uint32(g))
				c := crc32c(crc32c(seed, gb[:]), d[:0x1E])
				c = crc32c(c, []byte{0, 0})
				c = crc32c(c, d[0x20:])
				le.PutUint16(d[0x1E:], uint16(c))
			}
		}
	}
	le.PutUint32(sb[0x3FC:], crc32c(^uint32(0), sb[:0x3FC]))
	return out
}

// fixInodeChecksums returns a copy of body (at offset at of the image
// whose start is head, checksums fixed) with the checksum of every inode
// it holds recomputed, locating inode tables through the group
// descriptors in head: go-diskfs verifies inode checksums too.
func fixInodeChecksums(head []byte, at int64, body []byte) []byte {
	out := bytes.Clone(body)
	if len(head) < 2048 {
		return out
	}
	le := binary.LittleEndian
	sb := head[1024:2048]
	logBlock := le.Uint32(sb[0x18:])
	if logBlock > 6 || le.Uint32(sb[0x4C:]) < 1 {
		return out
	}
	blockSize := int64(1024) << logBlock
	inodeSize := int64(le.Uint16(sb[0x58:]))
	perGroup := int64(le.Uint32(sb[0x28:]))
	if inodeSize < 160 || perGroup == 0 {
		return out
	}
	seed := crc32c(^uint32(0), sb[0x68:0x78])
	if le.Uint32(sb[0x60:])&0x2000 != 0 {
		seed = le.Uint32(sb[0x270:])
	}
	descSize := int64(32)
	if le.Uint32(sb[0x60:])&0x80 != 0 {
		descSize = int64(le.Uint16(sb[0xFE:]))
	}
	gdt := blockSize
	if blockSize == 1024 {
		gdt = 2048
	}
	if descSize < 0x2C {
		return out
	}
	for g := int64(0); g < 64 && gdt+(g+1)*descSize <= int64(len(head)); g++ {
		d := head[gdt+g*descSize:]
		table := (int64(le.Uint32(d[0x08:])) | int64(le.Uint32(d[0x28:]))<<32) * blockSize
		if table < 0 || table > at+int64(len(out)) {
			continue
		}
		first := max(int64(0), (at-table+inodeSize-1)/inodeSize)
		for i := first; i < perGroup; i++ {
			off := table + i*inodeSize - at
			if off+inodeSize > int64(len(out)) {
				break
			}
			in := out[off : off+inodeSize]
			le.PutUint16(in[0x7C:], 0)
			le.PutUint16(in[0x82:], 0)
			var b [4]byte
			le.PutUint32(b[:], uint32(g*perGroup+i+1))
			c := crc32c(seed, b[:])
			c = crc32c(c, in[0x64:0x68]) // i_generation
			c = crc32c(c, in)
			le.PutUint16(in[0x7C:], uint16(c))
			le.PutUint16(in[0x82:], uint16(c>>16))
		}
	}
	return out
}

// walkImage lists dir and stats and reads what it finds, two levels deep.
func walkImage(im *Image, dir string, depth int) {
	list, err := im.List(dir)
	if err != nil {
		return
	}
	for _, e := range list {
		p := path.Join(dir, e.Name)
		if _, err := im.Stat(p); err != nil {
			continue
		}
		switch {
		case e.Mode.IsDir() && depth < 2 && e.Name != "." && e.Name != "..":
			walkImage(im, p, depth+1)
		case e.Mode.IsRegular():
			im.ReadFile(p)
		}
	}
}
