package imagetest

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// tarBlock is the tar record size.
const tarBlock = 512

// FixTarChecksums returns a copy of b in which every tar header found by
// walking the headers' size fields carries a valid checksum. Fuzz targets
// reading tarballs apply it, so that a mutated header reaches the code
// under test instead of failing archive/tar's checksum check. Walking
// stops at a size field that is not octal or points past the end.
func FixTarChecksums(b []byte) []byte {
	out := bytes.Clone(b)
	zero := make([]byte, tarBlock)
	for off := 0; off+tarBlock <= len(out); {
		h := out[off : off+tarBlock]
		off += tarBlock
		if bytes.Equal(h, zero) {
			continue
		}
		copy(h[148:156], "        ")
		sum := 0
		for _, c := range h {
			sum += int(c)
		}
		copy(h[148:156], fmt.Sprintf("%06o\x00 ", sum))
		size, err := strconv.ParseInt(strings.Trim(string(h[124:136]), " \x00"), 8, 64)
		if err != nil || size < 0 || size > int64(len(out)-off) {
			break
		}
		off += int((size + tarBlock - 1) / tarBlock * tarBlock)
	}
	return out
}
