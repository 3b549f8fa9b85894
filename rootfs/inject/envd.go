package inject

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/flatten"
)

// EnvdPath is where envd lands in the image, relative to its root.
const EnvdPath = "usr/local/bin/envd"

// Envd writes the envd binary to EnvdPath, mode 0755 root:root, stamped
// mtime, replacing whatever non-directory is there and creating missing
// parents (0755 root:root).
func Envd(ctx context.Context, t *flatten.Tree, envd []byte, mtime time.Time) error {
	if len(envd) == 0 {
		return errors.New("inject envd: empty payload")
	}
	err := t.WriteFile(ctx, EnvdPath, bytes.NewReader(envd), int64(len(envd)),
		flatten.FileAttr{Mode: 0o755, Mtime: mtime})
	if err != nil {
		return fmt.Errorf("inject envd: %w", err)
	}
	return nil
}
