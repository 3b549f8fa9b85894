package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// ByteSize is a size in bytes written either as a plain number or with a
// binary unit. TC's spelling ("512MiB", "20GiB"), upstream's and
// Kubernetes' ("512Mi", "20Gi") and the short one ("20G", "20GB") are all
// accepted, each a power of 1024: TC always read K, M, G and T that way, so
// an existing file keeps its meaning.
type ByteSize int64

// byteUnits are the suffixes ParseByteSize knows, longest first so that
// "GiB" is not read as "B"; the first five are the ones String writes.
var byteUnits = []struct {
	suffix string
	shift  uint
}{
	{"PiB", 50}, {"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10},
	{"Pi", 50}, {"Ti", 40}, {"Gi", 30}, {"Mi", 20}, {"Ki", 10},
	{"PB", 50}, {"TB", 40}, {"GB", 30}, {"MB", 20}, {"KB", 10}, {"kB", 10},
	{"P", 50}, {"T", 40}, {"G", 30}, {"M", 20}, {"K", 10}, {"k", 10}, {"B", 0},
}

// ParseByteSize parses a size such as "20GiB", "20Gi" or "20G".
func ParseByteSize(s string) (ByteSize, error) {
	s = strings.TrimSpace(s)
	bad := fmt.Errorf("%q is not a size like 512MiB, 512Mi or 20G", s)
	num, shift := s, uint(0)
	for _, u := range byteUnits {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, shift = strings.TrimSpace(n), u.shift
			break
		}
	}
	n, err := strconv.ParseUint(num, 10, 64)
	if err != nil || n > math.MaxInt64>>shift {
		return 0, bad
	}
	return ByteSize(n << shift), nil
}

// UnmarshalYAML accepts a number or a suffixed string.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseByteSize(n.Value)
	if err != nil {
		return err // the file's parse names the key and line
	}
	*b = v
	return nil
}

// String renders the size with the largest exact binary unit.
func (b ByteSize) String() string {
	for _, u := range byteUnits[:5] {
		if b != 0 && b%(1<<u.shift) == 0 {
			return strconv.FormatInt(int64(b)>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(b), 10)
}
