package fstest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"
)

// storeBlock is the granularity of MemStore: whole zero blocks are not kept,
// as the ext4 writer turns them into holes.
const storeBlock = ext4.BlockSize

// DataID is the handle s put into an ext4.Data (0 for the zero Data).
func (s *MemStore) DataID(d ext4.Data) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dataID(d)
}

// dataID reads the id held by d's block of the handle image; s.mu is held.
func (s *MemStore) dataID(d ext4.Data) uint64 {
	if d.Blocks() == 0 || s.handles == nil {
		return 0
	}
	var b [8]byte
	if _, err := io.ReadFull(s.handles.OpenData(d, int64(len(b))), b[:]); err != nil {
		return 0
	}
	return binary.LittleEndian.Uint64(b[:])
}

// makeData mints the ext4.Data of handle id: one block holding id in a
// handle image (a real ext4.Writer on an unlinked temporary file), since
// only a Writer can make a Data. s.mu is held.
func (s *MemStore) makeData(ctx context.Context, id uint64) (ext4.Data, error) {
	if s.handles == nil {
		f, err := os.CreateTemp("", "fstest-handles-*.ext4")
		if err != nil {
			return ext4.Data{}, fmt.Errorf("create handle image: %w", err)
		}
		os.Remove(f.Name())
		w, err := ext4.NewWriter(f, ext4.Options{})
		if err != nil {
			f.Close()
			return ext4.Data{}, fmt.Errorf("create handle image: %w", err)
		}
		s.handles = w
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], id)
	return s.handles.WriteData(ctx, bytes.NewReader(b[:]), int64(len(b)))
}

// MemStore keeps file data in memory (zero blocks elided, so huge sparse
// files cost little) and checks how the tree uses it: reading or releasing
// released data is recorded in Misuse.
type MemStore struct {
	mu       sync.Mutex
	next     uint64
	files    map[uint64]*memFile
	released int
	misuse   []string
	// handles holds the ids behind the ext4.Data values handed out.
	handles *ext4.Writer
}

type memFile struct {
	size   int64
	blocks map[int64][]byte
}

// NewMemStore returns an empty MemStore.
func NewMemStore() *MemStore { return &MemStore{files: make(map[uint64]*memFile)} }

// WriteData implements flatten.DataStore.
func (s *MemStore) WriteData(ctx context.Context, r io.Reader, size int64) (ext4.Data, error) {
	f := &memFile{size: size, blocks: make(map[int64][]byte)}
	buf := make([]byte, storeBlock)
	for off := int64(0); off < size; off += storeBlock {
		if err := ctx.Err(); err != nil {
			return ext4.Data{}, err
		}
		n := min(storeBlock, size-off)
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			return ext4.Data{}, fmt.Errorf("read data at %d of %d: %w", off, size, err)
		}
		if !isZero(buf[:n]) {
			f.blocks[off/storeBlock] = bytes.Clone(buf[:n])
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	d, err := s.makeData(ctx, s.next)
	if err != nil {
		return d, err
	}
	s.files[s.next] = f
	return d, nil
}

// Release implements flatten.DataStore.
func (s *MemStore) Release(d ext4.Data) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.dataID(d)
	if _, ok := s.files[id]; !ok {
		s.misuse = append(s.misuse, fmt.Sprintf("release of unknown or released data %d", id))
		return
	}
	delete(s.files, id)
	s.released++
}

// OpenData implements flatten.DataStore.
func (s *MemStore) OpenData(d ext4.Data, size int64) io.Reader {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.dataID(d)
	f, ok := s.files[id]
	if !ok {
		s.misuse = append(s.misuse, fmt.Sprintf("read of unknown or released data %d", id))
		return &errReader{fmt.Errorf("data %d not stored", id)}
	}
	if size != f.size {
		s.misuse = append(s.misuse, fmt.Sprintf("read of data %d with size %d, stored %d", id, size, f.size))
	}
	return &memReader{f: f}
}

// Live returns the ids of data written and not released.
func (s *MemStore) Live() map[uint64]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[uint64]bool, len(s.files))
	for id := range s.files {
		m[id] = true
	}
	return m
}

// Released counts Release calls on live data.
func (s *MemStore) Released() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.released
}

// Misuse lists bad calls seen so far.
func (s *MemStore) Misuse() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.misuse...)
}

type memReader struct {
	f   *memFile
	off int64
}

func (m *memReader) Read(p []byte) (int, error) {
	if m.off >= m.f.size {
		return 0, io.EOF
	}
	blk, in := m.off/storeBlock, m.off%storeBlock
	n := min(int64(len(p)), storeBlock-in, m.f.size-m.off)
	if b, ok := m.f.blocks[blk]; ok {
		copy(p[:n], b[in:])
	} else {
		clear(p[:n])
	}
	m.off += n
	return int(n), nil
}

type errReader struct{ err error }

func (e *errReader) Read([]byte) (int, error) { return 0, e.err }

var zeroBlock [storeBlock]byte

func isZero(b []byte) bool { return bytes.Equal(b, zeroBlock[:len(b)]) }

// DiscardStore reads and drops file data: for benchmarks of the tree alone.
// Every file gets the zero ext4.Data.
type DiscardStore struct{}

// WriteData implements flatten.DataStore.
func (s *DiscardStore) WriteData(ctx context.Context, r io.Reader, size int64) (ext4.Data, error) {
	n, err := io.CopyN(io.Discard, r, size)
	if err != nil {
		return ext4.Data{}, fmt.Errorf("read data: %d of %d bytes: %w", n, size, err)
	}
	return ext4.Data{}, nil
}

// Release implements flatten.DataStore.
func (s *DiscardStore) Release(ext4.Data) {}

// OpenData implements flatten.DataStore; the data is gone.
func (s *DiscardStore) OpenData(ext4.Data, int64) io.Reader {
	return &errReader{errors.New("DiscardStore keeps no data")}
}
