package config

import (
	"fmt"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Reserve is space to keep free on a filesystem: a size ("10GiB") or a
// percentage of the filesystem ("5%").
type Reserve struct {
	Bytes   ByteSize
	Percent float64
}

// ParseReserve parses a size such as "10GiB" or a percentage such as "5%".
func ParseReserve(s string) (Reserve, error) {
	s = strings.TrimSpace(s)
	if num, ok := strings.CutSuffix(s, "%"); ok {
		p, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
		// !(p >= 0 && p <= 100) also refuses NaN, which compares false
		// with everything and would disable the reserve.
		if err != nil || !(p >= 0 && p <= 100) {
			return Reserve{}, fmt.Errorf("%q is not a percentage from 0%% to 100%%", s)
		}
		return Reserve{Percent: p}, nil
	}
	b, err := ParseByteSize(s)
	if err != nil {
		return Reserve{}, fmt.Errorf("%q is not a size like 10GiB or a percentage like 5%%", s)
	}
	return Reserve{Bytes: b}, nil
}

// UnmarshalYAML accepts a size or a percentage.
func (r *Reserve) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseReserve(n.Value)
	if err != nil {
		return err // the file's parse names the key and line
	}
	*r = v
	return nil
}

// String renders the reserve as it is written in the configuration.
func (r Reserve) String() string {
	if r.Bytes == 0 {
		return strconv.FormatFloat(r.Percent, 'f', -1, 64) + "%"
	}
	return r.Bytes.String()
}
