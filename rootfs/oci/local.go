package oci

import (
	"fmt"
	"path/filepath"
	"strings"
)

// maxMetaSize bounds manifests, indexes and configs read from local sources.
const maxMetaSize = 16 << 20

// localPath checks that an offline source lies under one of the allowed
// roots and returns its symlink-free path.
func localPath(roots []string, pr ParsedRef) (string, error) {
	if len(roots) == 0 {
		return "", fmt.Errorf("%w: %s: offline sources are disabled (no local roots configured)", ErrLocalDisabled, pr)
	}
	real, err := filepath.EvalSymlinks(pr.Path)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", pr, err)
	}
	for _, root := range roots {
		rr, err := filepath.EvalSymlinks(root)
		if err != nil {
			continue
		}
		rel, err := filepath.Rel(rr, real)
		if err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return real, nil
		}
	}
	return "", fmt.Errorf("%w: %s is outside the allowed local roots", ErrLocalDisabled, pr.Path)
}
