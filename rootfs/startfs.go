package rootfs

import (
	"fmt"
	"io/fs"
	"path"
	"strings"
	"syscall"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/flatten"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/inject"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/inspect"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/startcheck"
)

// StartOverrides are the parts of a request's container_overrides the
// start check reads.
type StartOverrides = startcheck.Overrides

// StartCheck is the start check's answer, as the BUILT report carries it.
type StartCheck = startcheck.Result

// StartCheckMode says what a build does with the start check.
type StartCheckMode string

// The start check modes (build.start_check). The zero value is
// StartCheckFail, the default.
const (
	// StartCheckFail fails a build whose start command certainly cannot run.
	StartCheckFail StartCheckMode = "fail"
	// StartCheckWarn builds anyway; the problems ride in the result.
	StartCheckWarn StartCheckMode = "warn"
	// StartCheckOff skips the check: the artifact has no result.
	StartCheckOff StartCheckMode = "off"
)

// ParseStartCheckMode checks a build.start_check value; "" is the default.
func ParseStartCheckMode(s string) (StartCheckMode, error) {
	switch m := StartCheckMode(s); m {
	case "":
		return StartCheckFail, nil
	case StartCheckFail, StartCheckWarn, StartCheckOff:
		return m, nil
	}
	return "", fmt.Errorf("%q is not fail, warn or off", s)
}

// StartCheckError fails a build (mode fail) whose start command certainly
// cannot run. Its message begins "template start check: " and names the
// first problem.
type StartCheckError struct {
	Result StartCheck
}

func (e *StartCheckError) Error() string {
	msg := e.Result.Result
	if len(e.Result.Problems) > 0 {
		msg = e.Result.Problems[0]
	}
	return "template start check: " + msg
}

// defaultArch is the architecture of an image whose config names none.
const defaultArch = "amd64"

// startSpec is what the check looks at for an image of config cfg and
// architecture arch built with overrides o; envd is the injected envd's
// path, "" for none.
func startSpec(cfg ImageConfig, arch, envd string, o StartOverrides) startcheck.Spec {
	spec := startcheck.Effective(cfg.Entrypoint, cfg.Cmd, cfg.Env, cfg.WorkingDir, cfg.User, o)
	spec.Arch = arch
	if spec.Arch == "" {
		spec.Arch = defaultArch
	}
	spec.Envd = envd
	return spec
}

// checkTree runs the start check on the tree about to be laid out.
func checkTree(tree *flatten.Tree, img *Image, envd bool, o StartOverrides) StartCheck {
	envdPath := ""
	if envd {
		envdPath = "/" + inject.EnvdPath
	}
	return startcheck.Check(linkFS{treeFS{tree}}, startSpec(img.Config, img.Arch, envdPath, o))
}

// CheckImage runs the start check on the finished image at imagePath,
// through the image reader (rootfs/inspect): cfg and o give the command
// as a build would see it, arch the image platform's GOARCH ("" for
// amd64). An envd at its usual path is checked as the injected one.
func CheckImage(imagePath string, cfg ImageConfig, arch string, o StartOverrides) (StartCheck, error) {
	im, err := inspect.Open(imagePath)
	if err != nil {
		return StartCheck{}, err
	}
	defer im.Close()
	fsys := linkFS{imageFS{im}}
	envd := "/" + inject.EnvdPath
	if e, err := fsys.Lstat(envd); err != nil || !e.Mode.IsRegular() {
		envd = ""
	}
	return startcheck.Check(fsys, startSpec(cfg, arch, envd, o)), nil
}

// rawFS reads entries at paths whose directories hold no symlink; linkFS
// resolves the rest.
type rawFS interface {
	// lstat returns the entry at p, an error wrapping fs.ErrNotExist when
	// it is missing.
	lstat(p string) (startcheck.Entry, error)
	// readHead returns up to n bytes of the regular file at p.
	readHead(p string, n int) ([]byte, error)
}

// linkFS is a startcheck.FS over a rawFS: it follows the symlinks on the
// way to an entry as the guest's kernel would, inside the image root.
type linkFS struct{ raw rawFS }

// maxLinks bounds the symlinks one lookup follows, as Linux's MAXSYMLINKS.
const maxLinks = 40

// errLoop marks a lookup that followed more than maxLinks symlinks.
var errLoop = fmt.Errorf("more than %d symlinks: %w", maxLinks, syscall.ELOOP)

// Lstat returns the entry at p without following a final symlink.
func (l linkFS) Lstat(p string) (startcheck.Entry, error) {
	p = path.Clean("/" + p)
	if p == "/" {
		return l.raw.lstat(p)
	}
	dir, base := path.Split(p)
	real, err := l.resolve(dir)
	if err != nil {
		return startcheck.Entry{}, fmt.Errorf("lstat %s: %w", p, err)
	}
	return l.raw.lstat(path.Join(real, base))
}

// ReadHead returns up to n bytes of the regular file at p, following
// every symlink.
func (l linkFS) ReadHead(p string, n int) ([]byte, error) {
	real, err := l.resolve(p)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	return l.raw.readHead(real, n)
}

// resolve returns the path p leads to with every symlink followed:
// absolute targets start at the image root, ".." stops there.
func (l linkFS) resolve(p string) (string, error) {
	cur := "/"
	todo := strings.Split(p, "/")
	hops := 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, c)
		e, err := l.raw.lstat(next)
		if err != nil {
			return "", err
		}
		switch {
		case e.Mode&fs.ModeSymlink != 0:
			if hops++; hops > maxLinks {
				return "", fmt.Errorf("%s: %w", next, errLoop)
			}
			if e.Target == "" {
				return "", fmt.Errorf("%s: empty symlink: %w", next, fs.ErrNotExist)
			}
			if strings.HasPrefix(e.Target, "/") {
				cur = "/"
			}
			todo = append(strings.Split(e.Target, "/"), todo...)
		case !e.Mode.IsDir() && !onlyDots(todo):
			return "", fmt.Errorf("%s: %w", next, syscall.ENOTDIR)
		default:
			cur = next
		}
	}
	return cur, nil
}

// onlyDots reports whether the components left name nothing further.
func onlyDots(cs []string) bool {
	for _, c := range cs {
		if c != "" && c != "." {
			return false
		}
	}
	return true
}

// treeFS reads the flattened tree of a build in progress; file heads come
// back from the image being written.
type treeFS struct{ t *flatten.Tree }

func (t treeFS) lstat(p string) (startcheck.Entry, error) {
	n, err := t.t.Lookup(p)
	if err != nil {
		return startcheck.Entry{}, err
	}
	e := startcheck.Entry{Mode: fileMode(n.Mode)}
	if n.Mode&ext4.ModeTypeMask == ext4.ModeSymlink {
		e.Target = string(n.LinkTarget())
	}
	return e, nil
}

func (t treeFS) readHead(p string, n int) ([]byte, error) { return t.t.ReadHead(p, n) }

// fileMode converts an ext4 inode mode.
func fileMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & ext4.ModeTypeMask {
	case ext4.ModeDir:
		mode |= fs.ModeDir
	case ext4.ModeSymlink:
		mode |= fs.ModeSymlink
	case ext4.ModeChar:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case ext4.ModeBlock:
		mode |= fs.ModeDevice
	case ext4.ModeFIFO:
		mode |= fs.ModeNamedPipe
	case ext4.ModeSocket:
		mode |= fs.ModeSocket
	}
	for bit, fm := range map[uint32]fs.FileMode{0o4000: fs.ModeSetuid, 0o2000: fs.ModeSetgid, 0o1000: fs.ModeSticky} {
		if m&bit != 0 {
			mode |= fm
		}
	}
	return mode
}

// imageFS reads a finished image.
type imageFS struct{ im *inspect.Image }

func (i imageFS) lstat(p string) (startcheck.Entry, error) {
	e, err := i.im.Lstat(p)
	if err != nil {
		return startcheck.Entry{}, err
	}
	return startcheck.Entry{Mode: e.Mode, Target: e.LinkTarget}, nil
}

func (i imageFS) readHead(p string, n int) ([]byte, error) { return i.im.ReadHead(p, n) }
