package rootfs

import (
	"fmt"
	"io"
	"io/fs"

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

// checkTree runs the start check on the tree about to be laid out, whose
// file content store holds.
func checkTree(tree *flatten.Tree, store flatten.DataStore, img *Image, envd bool, o StartOverrides) StartCheck {
	envdPath := ""
	if envd {
		envdPath = "/" + inject.EnvdPath
	}
	return startcheck.Check(treeFS{tree, store}, startSpec(img.Config, img.Arch, envdPath, o))
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
	fsys := imageFS{im}
	envd := "/" + inject.EnvdPath
	if e, err := fsys.Lstat(envd); err != nil || !e.Mode.IsRegular() {
		envd = ""
	}
	return startcheck.Check(fsys, startSpec(cfg, arch, envd, o)), nil
}

// treeFS reads the flattened tree of a build in progress; file content
// comes back from the image being written (store).
type treeFS struct {
	t     *flatten.Tree
	store flatten.DataStore
}

// Lstat implements startcheck.FS: the check resolves symlinks itself.
func (t treeFS) Lstat(p string) (startcheck.Entry, error) {
	n, err := t.t.Lookup(p)
	if err != nil {
		return startcheck.Entry{}, err
	}
	e := startcheck.Entry{Mode: fileMode(n.Mode), UID: n.UID, GID: n.GID}
	if n.Mode&ext4.ModeTypeMask == ext4.ModeSymlink {
		e.Target = string(n.LinkTarget())
	}
	return e, nil
}

// ReadHead implements startcheck.FS.
func (t treeFS) ReadHead(p string, n int) ([]byte, error) { return t.t.ReadHead(p, n) }

// ReadAt implements startcheck.FS: it seeks in the content as the image
// holds it, so that reading far into a large file reads only what is
// asked for.
func (t treeFS) ReadAt(p string, b []byte, off int64) (int, error) {
	n, err := t.t.Lookup(p)
	if err != nil {
		return 0, err
	}
	if n.Mode&ext4.ModeTypeMask != ext4.ModeRegular {
		return 0, fmt.Errorf("read %q: not a regular file", p)
	}
	if off < 0 {
		return 0, fmt.Errorf("read %q at %d: negative offset", p, off)
	}
	if off >= n.Size {
		return 0, io.EOF
	}
	r := t.store.OpenData(n.Data, n.Size)
	if s, ok := r.(io.Seeker); ok {
		_, err = s.Seek(off, io.SeekStart)
	} else {
		_, err = io.CopyN(io.Discard, r, off)
	}
	if err != nil {
		return 0, fmt.Errorf("read %q at %d: %w", p, off, err)
	}
	want := min(int64(len(b)), n.Size-off)
	k, err := io.ReadFull(r, b[:want])
	if err != nil {
		return k, fmt.Errorf("read %q at %d: %w", p, off, err)
	}
	if want < int64(len(b)) {
		return k, io.EOF
	}
	return k, nil
}

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

// Lstat implements startcheck.FS.
func (i imageFS) Lstat(p string) (startcheck.Entry, error) {
	e, err := i.im.Lstat(p)
	if err != nil {
		return startcheck.Entry{}, err
	}
	return startcheck.Entry{Mode: e.Mode, Target: e.LinkTarget, UID: e.UID, GID: e.GID}, nil
}

// ReadHead implements startcheck.FS.
func (i imageFS) ReadHead(p string, n int) ([]byte, error) { return i.im.ReadHead(p, n) }

// ReadAt implements startcheck.FS.
func (i imageFS) ReadAt(p string, b []byte, off int64) (int, error) { return i.im.ReadAt(p, b, off) }
