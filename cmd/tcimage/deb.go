package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// platformInput is one platform of the image and the binary built for it.
type platformInput struct {
	goarch, variant string
	binary          string
}

// debianArch maps a Go architecture (and ARM variant) to Debian's name.
func debianArch(goarch, variant string) (string, error) {
	switch {
	case goarch == "amd64" && variant == "":
		return "amd64", nil
	case goarch == "arm64" && (variant == "" || variant == "v8"):
		return "arm64", nil
	case goarch == "arm" && (variant == "" || variant == "v7"):
		return "armhf", nil
	case goarch == "386" && variant == "":
		return "i386", nil
	case goarch == "ppc64le" && variant == "":
		return "ppc64el", nil
	case goarch == "s390x" && variant == "":
		return "s390x", nil
	case goarch == "riscv64" && variant == "":
		return "riscv64", nil
	}
	return "", fmt.Errorf("no Debian architecture for GOARCH %q variant %q", goarch, variant)
}

// debPackage is one .deb file and its control fields.
type debPackage struct {
	path    string
	name    string
	version string
	arch    string
	// control is the package's control file, as dpkg's status database
	// keeps it (for scanners reading /var/lib/dpkg/status.d).
	control []byte
}

// fetchPackage returns name's .deb for arch from dir, downloading it there
// with apt-get download when dir has none. Several versions in dir are an
// error: which one the image gets must not depend on directory order.
func fetchPackage(ctx context.Context, dir, name, arch string, logger *slog.Logger) (debPackage, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return debPackage{}, fmt.Errorf("create %s: %w", dir, err)
	}
	find := func() ([]string, error) {
		var found []string
		for _, a := range []string{arch, "all"} {
			m, err := filepath.Glob(filepath.Join(dir, name+"_*_"+a+".deb"))
			if err != nil {
				return nil, err
			}
			found = append(found, m...)
		}
		return found, nil
	}
	found, err := find()
	if err != nil {
		return debPackage{}, err
	}
	if len(found) == 0 {
		logger.Info("downloading Debian package", "package", name, "arch", arch, "dir", dir)
		cmd := exec.CommandContext(ctx, "apt-get", "download", "-q", name+":"+arch)
		cmd.Dir = dir
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			hint := " (are the package lists there? apt-get update)"
			if arch != hostDebianArch(ctx) {
				hint = fmt.Sprintf(" (a foreign architecture needs `dpkg --add-architecture %s && apt-get update` first)", arch)
			}
			return debPackage{}, fmt.Errorf("apt-get download %s:%s: %w%s: %s", name, arch, err, hint, strings.TrimSpace(stderr.String()))
		}
		if found, err = find(); err != nil {
			return debPackage{}, err
		}
	}
	switch len(found) {
	case 0:
		return debPackage{}, fmt.Errorf("no %s .deb for %s in %s after apt-get download", name, arch, dir)
	case 1:
	default:
		return debPackage{}, fmt.Errorf("several %s packages for %s in %s (%s): remove the stale ones", name, arch, dir, strings.Join(found, ", "))
	}
	return readControl(ctx, found[0], name, arch)
}

// hostDebianArch is dpkg's architecture, or "" when dpkg cannot say.
func hostDebianArch(ctx context.Context) string {
	out, err := exec.CommandContext(ctx, "dpkg", "--print-architecture").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// readControl reads a .deb's control file and checks it is name for arch.
func readControl(ctx context.Context, path, name, arch string) (debPackage, error) {
	control, err := exec.CommandContext(ctx, "dpkg-deb", "--field", path).Output()
	if err != nil {
		return debPackage{}, fmt.Errorf("dpkg-deb --field %s: %w", path, exitDetail(err))
	}
	p := debPackage{path: path, control: control}
	for line := range strings.Lines(string(control)) {
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.HasPrefix(line, " ") {
			continue
		}
		switch k {
		case "Package":
			p.name = strings.TrimSpace(v)
		case "Version":
			p.version = strings.TrimSpace(v)
		case "Architecture":
			p.arch = strings.TrimSpace(v)
		}
	}
	if p.name != name || (p.arch != arch && p.arch != "all") || p.version == "" {
		return debPackage{}, fmt.Errorf("%s is package %q version %q for %q, want %s for %s", path, p.name, p.version, p.arch, name, arch)
	}
	return p, nil
}

// unpack adds the package's files to fs as dpkg-deb extracts them, without
// running maintainer scripts, owned by root. Documentation other than the
// copyright files, manual pages and lintian overrides are left out.
func unpack(ctx context.Context, p debPackage, fs *tree) error {
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", p.path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w", p.path, err)
	}
	rerr := readDataTar(out, p.name, fs)
	if rerr != nil {
		io.Copy(io.Discard, out)
	}
	werr := cmd.Wait()
	if rerr != nil {
		return fmt.Errorf("%s: %w", p.path, rerr)
	}
	if werr != nil {
		return fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w: %s", p.path, werr, strings.TrimSpace(stderr.String()))
	}
	return nil
}

func readDataTar(r io.Reader, pkg string, fs *tree) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read data: %w", err)
		}
		name := cleanName(h.Name)
		if name == "" || dropped(name) {
			continue
		}
		e := &entry{name: name, mode: h.FileInfo().Mode().Perm() | modeBits(h.Mode), owner: pkg}
		switch h.Typeflag {
		case tar.TypeDir:
			e.kind = tar.TypeDir
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			if err != nil {
				return fmt.Errorf("read %s: %w", name, err)
			}
			e.kind, e.data = tar.TypeReg, data
		case tar.TypeSymlink:
			e.kind, e.link = tar.TypeSymlink, h.Linkname
		case tar.TypeLink:
			e.kind, e.link = tar.TypeLink, cleanName(h.Linkname)
		default:
			return fmt.Errorf("%s: unsupported entry type %q", name, h.Typeflag)
		}
		if err := fs.add(e); err != nil {
			return err
		}
	}
}

// cleanName turns "./a/b/" into "a/b".
func cleanName(n string) string {
	n = strings.TrimPrefix(n, "./")
	n = strings.Trim(n, "/")
	if n == "." {
		return ""
	}
	return n
}

// modeBits keeps setuid, setgid and sticky from a tar mode.
func modeBits(m int64) os.FileMode {
	var b os.FileMode
	if m&0o4000 != 0 {
		b |= os.ModeSetuid
	}
	if m&0o2000 != 0 {
		b |= os.ModeSetgid
	}
	if m&0o1000 != 0 {
		b |= os.ModeSticky
	}
	return b
}

// dropped reports package files the image leaves out: documentation
// (copyright files stay, for the licences), manual pages, lintian data.
func dropped(name string) bool {
	for _, p := range []string{"usr/share/man", "usr/share/info", "usr/share/lintian"} {
		if name == p || strings.HasPrefix(name, p+"/") {
			return true
		}
	}
	if rest, ok := strings.CutPrefix(name, "usr/share/doc/"); ok {
		_, file, nested := strings.Cut(rest, "/")
		return nested && file != "copyright"
	}
	return false
}

func exitDetail(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
	}
	return err
}
