package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// tool is a program the benchmark runs and the Debian package shipping it.
type tool struct {
	name, pkg string
}

// tools are the programs upstream's pipeline and the harness need.
var tools = [...]tool{
	{"skopeo", "skopeo"},
	{"umoci", "umoci"},
	{"docker-registry", "docker-registry"},
	{"mkfs.ext4", "e2fsprogs"},
	{"e2fsck", "e2fsprogs"},
	{"resize2fs", "e2fsprogs"},
	{"truncate", "coreutils"},
	{"losetup", "mount"},
	{"time", "time"},
	// The two-replica rows' database.
	{"mariadbd", "mariadb-server"},
}

// debootstrapTool makes the Debian tree (ImageDebian, ImageLarge).
var debootstrapTool = tool{"debootstrap", "debootstrap"}

// lookTool finds a program on PATH or in the sbin directories, which are
// not on every root PATH.
func lookTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin"} {
		p := dir + "/" + name
		if fi, err := os.Stat(p); err == nil && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found", name)
}

// EnsureTools installs, with apt-get, the Debian packages of the tools the
// benchmark of images needs that are missing (debootstrap only when an
// image built from the Debian tree is wanted and the tree is not cached).
func EnsureTools(ctx context.Context, imgs []string, log io.Writer) error {
	need := append([]tool(nil), tools[:]...)
	for _, name := range imgs {
		if name == ImageDebian || name == ImageLarge {
			if _, err := os.Stat(images.DebianRootfsDir); err != nil {
				need = append(need, debootstrapTool)
			}
			break
		}
	}
	seen := map[string]bool{}
	var pkgs []string
	for _, t := range need {
		if _, err := lookTool(t.name); err != nil && !seen[t.pkg] {
			seen[t.pkg] = true
			pkgs = append(pkgs, t.pkg)
		}
	}
	if len(pkgs) == 0 {
		return nil
	}
	hint := "apt-get install -y " + strings.Join(pkgs, " ")
	fmt.Fprintf(log, "installing %s\n", strings.Join(pkgs, " "))
	cmd := exec.CommandContext(ctx, "sh", "-c", "apt-get update -qq && "+hint)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ensure tools: %s: %w\n%s", hint, err, images.Tail(out, 4096))
	}
	for _, t := range need {
		if _, err := lookTool(t.name); err != nil {
			return fmt.Errorf("ensure tools: %w after installing", err)
		}
	}
	return nil
}
