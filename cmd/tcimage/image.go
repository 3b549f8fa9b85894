package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's conventions; docs/operations.md ("The container image")
// describes them to operators.
const (
	// uid and gid of the unprivileged user the agent runs as.
	uid, gid = 65532, 65532
	userName = "templatecenter"
	// stateDir is the one writable place the agent needs: the chart
	// mounts a volume there (spool, store, work directory).
	stateDir   = "var/lib/cube-templatecenter"
	binaryPath = "usr/bin/templatecenter"
	// packagesAnnotation lists the image's Debian packages, name=version.
	packagesAnnotation = "org.cubesandbox.templatecenter.debian-packages"
)

// imageEnv is the image's default environment: every path the agent
// writes is under stateDir. The environment overrides the configuration
// file, so a deployment that wants other paths sets these variables.
var imageEnv = []string{
	"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
	"CUBE_TEMPLATE_CENTER_SPOOL_PATH=/" + stateDir + "/spool.db",
	"CUBE_TEMPLATE_CENTER_ARTIFACT_STORE_DIR=/" + stateDir + "/store",
	"CUBE_TEMPLATE_CENTER_WORK_DIR=/" + stateDir + "/work",
}

// buildSpec is what one image build takes.
type buildSpec struct {
	platforms                 []platformInput
	packages                  []string
	debDir                    string
	version, revision, source string
	mtime                     time.Time
}

// build makes the image index: one image per platform.
func build(ctx context.Context, spec buildSpec, logger *slog.Logger) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var adds []mutate.IndexAddendum
	var allPkgs []string
	for _, p := range spec.platforms {
		img, pkgs, err := buildPlatform(ctx, spec, p, logger)
		if err != nil {
			return nil, fmt.Errorf("linux/%s: %w", p.goarch, err)
		}
		allPkgs = append(allPkgs, pkgs...)
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: "linux", Architecture: p.goarch, Variant: p.variant},
		}})
	}
	idx = mutate.AppendManifests(idx, adds...)
	slices.Sort(allPkgs)
	allPkgs = slices.Compact(allPkgs)
	return mutate.Annotations(idx, annotations(spec, allPkgs)).(v1.ImageIndex), nil
}

// annotations are the OCI annotations (and config labels) of the image.
func annotations(spec buildSpec, pkgs []string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "cube-templatecenter",
		"org.opencontainers.image.description": "CubeTemplateCenter: OCI images to ext4 microVM template root filesystems for Cube Sandbox",
		"org.opencontainers.image.version":     spec.version,
		"org.opencontainers.image.revision":    spec.revision,
		"org.opencontainers.image.source":      spec.source,
		"org.opencontainers.image.licenses":    "Apache-2.0",
		"org.opencontainers.image.created":     spec.mtime.Format(time.RFC3339),
		packagesAnnotation:                     strings.Join(pkgs, ","),
	}
}

// buildPlatform makes one platform's image: a layer of Debian packages and
// the image's own files, then a layer with the binary (so a new version
// shares the first layer with the last one). It returns the image and its
// packages as name=version.
func buildPlatform(ctx context.Context, spec buildSpec, p platformInput, logger *slog.Logger) (v1.Image, []string, error) {
	arch, err := debianArch(p.goarch, p.variant)
	if err != nil {
		return nil, nil, err
	}
	if err := checkMachine(p.binary, p.goarch); err != nil {
		return nil, nil, err
	}
	bin, err := os.ReadFile(p.binary)
	if err != nil {
		return nil, nil, fmt.Errorf("read the binary: %w", err)
	}
	base := newTree()
	var pkgs []string
	for _, name := range spec.packages {
		deb, err := fetchPackage(ctx, filepath.Join(spec.debDir, arch), name, arch, logger)
		if err != nil {
			return nil, nil, err
		}
		if err := unpack(ctx, deb, base); err != nil {
			return nil, nil, err
		}
		// dpkg's per-package status files, as distroless images keep
		// them, so image scanners see what is installed.
		base.set(&entry{name: "var/lib/dpkg/status.d/" + deb.name, kind: tar.TypeReg, mode: 0o644, owner: "image",
			data: append(bytes.TrimRight(deb.control, "\n"), []byte("\nStatus: install ok installed\n")...)})
		pkgs = append(pkgs, deb.name+"="+deb.version)
	}
	if err := addImageFiles(base); err != nil {
		return nil, nil, err
	}
	app := newTree()
	app.set(&entry{name: binaryPath, kind: tar.TypeReg, mode: 0o755, data: bin, owner: "image"})

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	labels := annotations(spec, pkgs)
	img, err = mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: p.goarch,
		Variant:      p.variant,
		OS:           "linux",
		Created:      v1.Time{Time: spec.mtime},
		RootFS:       v1.RootFS{Type: "layers"},
		Config: v1.Config{
			User:         fmt.Sprintf("%d:%d", uid, gid),
			Env:          imageEnv,
			Entrypoint:   []string{"/" + binaryPath},
			WorkingDir:   "/" + stateDir,
			ExposedPorts: map[string]struct{}{"8090/tcp": {}},
			Volumes:      map[string]struct{}{"/" + stateDir: {}},
			Labels:       labels,
			StopSignal:   "SIGTERM",
		},
	})
	if err != nil {
		return nil, nil, err
	}
	for _, l := range []struct {
		t   *tree
		why string
	}{
		{base, "Debian packages " + strings.Join(pkgs, " ") + " (unpacked, no maintainer scripts), user " + userName},
		{app, "templatecenter " + spec.version},
	} {
		blob, err := gzipLayer(l.t, spec.mtime)
		if err != nil {
			return nil, nil, err
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(blob)), nil
		}, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return nil, nil, err
		}
		img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
			Created: v1.Time{Time: spec.mtime}, CreatedBy: "tcimage: " + l.why,
		}})
		if err != nil {
			return nil, nil, err
		}
	}
	img = mutate.Annotations(img, labels).(v1.Image)
	return img, pkgs, nil
}

// elfMachines is the ELF machine of each Go architecture tcimage knows.
var elfMachines = map[string]elf.Machine{
	"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "arm": elf.EM_ARM, "386": elf.EM_386,
	"ppc64le": elf.EM_PPC64, "s390x": elf.EM_S390, "riscv64": elf.EM_RISCV,
}

// checkMachine refuses a binary built for another architecture than the
// platform it is put in: such an image would only fail when run.
func checkMachine(path, goarch string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("the binary %s: %w", path, err)
	}
	defer f.Close()
	if want := elfMachines[goarch]; f.Machine != want {
		return fmt.Errorf("the binary %s is for %v, not %s (%v): build it with GOARCH=%s", path, f.Machine, goarch, want, goarch)
	}
	return nil
}

// addImageFiles adds what the packages' maintainer scripts and an
// installer would have made: the users, name service switch, the CA bundle,
// and the directories the agent runs with.
func addImageFiles(t *tree) error {
	file := func(name, text string) {
		t.set(&entry{name: name, kind: tar.TypeReg, mode: 0o644, data: []byte(text), owner: "image"})
	}
	file("etc/passwd", "root:x:0:0:root:/root:/usr/sbin/nologin\n"+
		fmt.Sprintf("%s:x:%d:%d:CubeTemplateCenter:/%s:/usr/sbin/nologin\n", userName, uid, gid, stateDir))
	file("etc/group", "root:x:0:\n"+fmt.Sprintf("%s:x:%d:\n", userName, gid))
	file("etc/nsswitch.conf", "passwd: files\ngroup: files\nhosts: files dns\n")
	bundle, err := caBundle(t)
	if err != nil {
		return err
	}
	file("etc/ssl/certs/ca-certificates.crt", bundle)
	t.set(&entry{name: "tmp", kind: tar.TypeDir, mode: 0o777 | os.ModeSticky, owner: "image"})
	t.set(&entry{name: "root", kind: tar.TypeDir, mode: 0o700, owner: "image"})
	// Mount points: the state volume (the agent's own), the configuration
	// and the egress CA, which deployments mount read-only.
	t.set(&entry{name: stateDir, kind: tar.TypeDir, mode: 0o750, uid: uid, gid: gid, owner: "image"})
	t.set(&entry{name: "etc/cube-templatecenter", kind: tar.TypeDir, mode: 0o755, owner: "image"})
	t.set(&entry{name: "etc/cube/ca", kind: tar.TypeDir, mode: 0o755, owner: "image"})
	return nil
}

// caBundle concatenates the certificates of ca-certificates in name
// order, as update-ca-certificates (its maintainer script, not run here)
// does with every certificate enabled.
func caBundle(t *tree) (string, error) {
	var names []string
	for n, e := range t.entries {
		if strings.HasPrefix(n, "usr/share/ca-certificates/") && strings.HasSuffix(n, ".crt") && e.kind == tar.TypeReg {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return "", fmt.Errorf("no certificates under /usr/share/ca-certificates: is ca-certificates among the packages?")
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		d := t.entries[n].data
		b.Write(d)
		if len(d) > 0 && d[len(d)-1] != '\n' {
			b.WriteByte('\n')
		}
	}
	return b.String(), nil
}

// writeLayout writes idx as an OCI image layout at dir (replacing it),
// named by each tag, and returns the index's digest.
func writeLayout(dir string, idx v1.ImageIndex, tags []string) (string, error) {
	if err := os.RemoveAll(dir); err != nil {
		return "", fmt.Errorf("remove the old layout: %w", err)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return "", fmt.Errorf("create layout %s: %w", dir, err)
	}
	for _, tag := range tags {
		if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag})); err != nil {
			return "", fmt.Errorf("write layout %s: %w", dir, err)
		}
	}
	d, err := idx.Digest()
	if err != nil {
		return "", err
	}
	return d.String(), nil
}

// writeArchive writes the layout dir as an OCI archive (a tar of the
// layout, readable as oci-archive:PATH by skopeo): sorted entries, root
// owned, every time mtime.
func writeArchive(dir, path string, mtime time.Time) error {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			names = append(names, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read layout %s: %w", dir, err)
	}
	slices.Sort(names)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".image-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	tw := tar.NewWriter(f)
	for _, p := range names {
		rel, _ := filepath.Rel(dir, p)
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, ModTime: mtime, Format: tar.FormatPAX, Typeflag: tar.TypeReg}
		if fi.IsDir() {
			h.Name, h.Mode, h.Typeflag = h.Name+"/", 0o755, tar.TypeDir
		} else {
			h.Size = fi.Size()
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.IsDir() {
			if err := copyFile(tw, p); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return os.Chmod(path, 0o644)
}

func copyFile(w io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}
