package config

import (
	"fmt"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// ByteSize is a size in bytes written either as a plain number or with a
// binary suffix: "512MiB", "20GiB", "1TiB" (KiB, MiB, GiB, TiB; K, M, G, T
// mean the same).
type ByteSize int64

var byteUnits = []struct {
	suffix string
	shift  uint
}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"T", 40}, {"G", 30}, {"M", 20}, {"K", 10}, {"B", 0}}

// ParseByteSize parses a size such as "20GiB".
func ParseByteSize(s string) (ByteSize, error) {
	s = strings.TrimSpace(s)
	for _, u := range byteUnits {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(num), 10, 64)
			if err != nil || n > (1<<63-1)>>u.shift {
				return 0, fmt.Errorf("%q is not a size like 512MiB", s)
			}
			return ByteSize(n << u.shift), nil
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a size like 512MiB", s)
	}
	return ByteSize(n), nil
}

// UnmarshalYAML accepts a number or a suffixed string.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseByteSize(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*b = v
	return nil
}

// String renders the size with the largest exact binary unit.
func (b ByteSize) String() string {
	for _, u := range byteUnits[:4] {
		if b != 0 && b%(1<<u.shift) == 0 {
			return strconv.FormatInt(int64(b)>>u.shift, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(b), 10)
}
