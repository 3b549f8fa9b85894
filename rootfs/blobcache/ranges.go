package blobcache

import "sort"

// Range is the bytes [Off, End) of a blob.
type Range struct{ Off, End int64 }

// Len returns the number of bytes in r.
func (r Range) Len() int64 { return r.End - r.Off }

// rangeSet is a sorted list of disjoint, non-adjacent, non-empty ranges.
type rangeSet []Range

// overlaps reports whether any byte of r is in s.
func (s rangeSet) overlaps(r Range) bool {
	i := sort.Search(len(s), func(i int) bool { return s[i].End > r.Off })
	return i < len(s) && s[i].Off < r.End
}

// add puts r into s, merging it with the ranges it touches.
func (s *rangeSet) add(r Range) {
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

// trimFront drops the bytes before off from the first range, which must
// start at or before off.
func (s *rangeSet) trimFront(off int64) {
	rs := *s
	if len(rs) == 0 {
		return
	}
	if rs[0].End <= off {
		*s = rs[1:]
		return
	}
	rs[0].Off = max(rs[0].Off, off)
}

// gaps returns the ranges of [from, size) that are not in s.
func (s rangeSet) gaps(from, size int64) []Range {
	var out []Range
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
