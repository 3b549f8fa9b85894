package ext4

import (
	"cmp"
	"fmt"
	"os"
	"slices"
)

// sink batches metadata block writes and issues them sorted, merging
// neighbouring blocks into single WriteAt calls.
type sink struct {
	f     *os.File
	items []sinkItem
	bytes int
	buf   []byte
}

type sinkItem struct {
	block uint64
	data  []byte // a multiple of BlockSize
}

const sinkFlushBytes = 32 << 20

func newSink(f *os.File) *sink { return &sink{f: f} }

func (s *sink) put(block uint64, data []byte) error {
	s.items = append(s.items, sinkItem{block, data})
	s.bytes += len(data)
	if s.bytes >= sinkFlushBytes {
		return s.flush()
	}
	return nil
}

func (s *sink) flush() error {
	slices.SortFunc(s.items, func(a, b sinkItem) int { return cmp.Compare(a.block, b.block) })
	for i := 0; i < len(s.items); {
		j := i + 1
		end := s.items[i].block + uint64(len(s.items[i].data)/BlockSize)
		for j < len(s.items) && s.items[j].block == end && end-s.items[i].block < 1024 {
			end += uint64(len(s.items[j].data) / BlockSize)
			j++
		}
		data := s.items[i].data
		if j > i+1 {
			s.buf = s.buf[:0]
			for _, it := range s.items[i:j] {
				s.buf = append(s.buf, it.data...)
			}
			data = s.buf
		}
		if _, err := s.f.WriteAt(data, int64(s.items[i].block)*BlockSize); err != nil {
			return fmt.Errorf("write metadata at block %d: %w", s.items[i].block, err)
		}
		i = j
	}
	s.items = s.items[:0]
	s.bytes = 0
	return nil
}
