package blobcache

import "sort"

// Range is the bytes [Off, End) of a blob.
type Range struct{ Off, End int64 }

// Len returns the number of bytes in r.
func (r Range) Len() int64 { return r.End - r.Off }

// RangeSet is a sorted list of disjoint, non-adjacent, non-empty ranges:
// the bytes of a blob a Partial holds ahead of its prefix, or those no
// download stream has claimed yet.
type RangeSet []Range

// Overlaps reports whether any byte of r is in s.
func (s RangeSet) Overlaps(r Range) bool {
	i := sort.Search(len(s), func(i int) bool { return s[i].End > r.Off })
	return i < len(s) && s[i].Off < r.End
}

// Add puts r into s, merging it with the ranges it touches.
func (s *RangeSet) Add(r Range) {
	if r.Len() <= 0 {
		return
	}
	rs := *s
	// First range ending at or after r.Off (touching counts), and first
	// starting after r.End.
	i := sort.Search(len(rs), func(i int) bool { return rs[i].End >= r.Off })
	j := sort.Search(len(rs), func(j int) bool { return rs[j].Off > r.End })
	if i < j {
		r.Off = min(r.Off, rs[i].Off)
		r.End = max(r.End, rs[j-1].End)
	}
	out := append(rs[:i:i], r)
	*s = append(out, rs[j:]...)
}

// Remove takes the bytes of r out of s.
func (s *RangeSet) Remove(r Range) {
	if r.Len() <= 0 {
		return
	}
	rs := *s
	// First range ending after r.Off, and first starting at or after r.End.
	i := sort.Search(len(rs), func(i int) bool { return rs[i].End > r.Off })
	j := sort.Search(len(rs), func(j int) bool { return rs[j].Off >= r.End })
	if i >= j {
		return
	}
	out := rs[:i:i]
	if rs[i].Off < r.Off {
		out = append(out, Range{rs[i].Off, r.Off})
	}
	if rs[j-1].End > r.End {
		out = append(out, Range{r.End, rs[j-1].End})
	}
	*s = append(out, rs[j:]...)
}

// Next returns the first byte of s at or after pos.
func (s RangeSet) Next(pos int64) (int64, bool) {
	i := sort.Search(len(s), func(i int) bool { return s[i].End > pos })
	if i == len(s) {
		return 0, false
	}
	return max(pos, s[i].Off), true
}

// Bytes returns how many bytes s holds.
func (s RangeSet) Bytes() int64 {
	var n int64
	for _, r := range s {
		n += r.Len()
	}
	return n
}

// Gaps returns the ranges of [from, size) that are not in s.
func (s RangeSet) Gaps(from, size int64) RangeSet {
	var out RangeSet
	pos := from
	for _, r := range s {
		if r.End <= pos {
			continue
		}
		if r.Off > pos {
			out = append(out, Range{pos, min(r.Off, size)})
		}
		pos = max(pos, r.End)
		if pos >= size {
			break
		}
	}
	if pos < size {
		out = append(out, Range{pos, size})
	}
	return out
}
