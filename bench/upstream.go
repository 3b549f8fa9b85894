package bench

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/test/childproc"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// Step is one step of upstream's pipeline, measured. Steps that run in
// upstream's own Go process (hooks, size estimate, hashing, cleanup) have
// no RSS or write figures: the harness does them in its process, and their
// CPU time is the harness's.
type Step struct {
	Name    string        `json:"name"`
	Wall    time.Duration `json:"wall_ns"`
	PeakRSS int64         `json:"peak_rss_bytes"`
	Written int64         `json:"written_bytes"`
	CPU     time.Duration `json:"cpu_ns"`
}

// Upstream's sizing constants for its first-pass image size: the content
// plus a fixed 256 MiB, plus 10 %, plus 1 KiB per file, at least 1 GiB.
const (
	upstreamFixedOverhead = 256 << 20
	upstreamOverheadPct   = 10
	upstreamPerFile       = 1 << 10
	upstreamMinRaw        = 1 << 30
	upstreamRawAlign      = 256 << 20
	pmemAlign             = 2 << 20
)

// upstreamSize is upstream's scratch image size for data bytes in files
// non-directory entries: data + 256 MiB + 10 % + 1 KiB per file, at least
// 1 GiB, rounded up to 256 MiB.
func upstreamSize(data, files int64) int64 {
	raw := data + upstreamFixedOverhead + data*upstreamOverheadPct/100 + files*upstreamPerFile
	raw = max(raw, upstreamMinRaw)
	return roundUp(raw, upstreamRawAlign)
}

func roundUp(n, m int64) int64 { return (n + m - 1) / m * m }

// upstreamJob is one run of upstream's dockerless pipeline.
type upstreamJob struct {
	// Ref is the image in the loopback registry (host/repo:tag).
	Ref string
	// Dir holds the store and work directories; the published image is
	// Dir/store/<id>/<id>.ext4.
	Dir string
	ID  string
	// Envd and CAPEM are injected as upstream's post-export hooks do.
	Envd  []byte
	CAPEM []byte
}

// upstreamResult is what the pipeline produced.
type upstreamResult struct {
	Steps  []Step
	Wall   time.Duration
	Image  string
	SHA256 string
}

// runUpstream runs upstream's default "dockerless" build pipeline step by
// step, as upstream's TemplateCenter runs it for one template: skopeo inspect (digest, then config), skopeo copy to an
// OCI layout, umoci unpack, envd and CA hooks, size estimate, truncate,
// mkfs.ext4 -d, e2fsck -fy, resize2fs -M, truncate to a 2 MiB multiple,
// e2fsck -fn, rename, sha256 (in process with a 4 MiB buffer, as upstream
// hashes), and removal of the staged tree.
func runUpstream(ctx context.Context, j upstreamJob) (*upstreamResult, error) {
	res := &upstreamResult{}
	storeDir := filepath.Join(j.Dir, "store", j.ID)
	workDir := filepath.Join(j.Dir, "work", j.ID)
	final := filepath.Join(storeDir, j.ID+".ext4")
	tmp := final + ".tmp." + strconv.Itoa(os.Getpid())
	rootfs := filepath.Join(storeDir, "rootfs")
	src := "docker://" + j.Ref
	began := time.Now()

	run := func(name string, okCodes []int, argv ...string) error {
		u, err := runTool(ctx, okCodes, argv...)
		res.Steps = append(res.Steps, Step{Name: name, Wall: u.Wall, PeakRSS: u.MaxRSS, Written: u.WriteBytes, CPU: u.CPU})
		return err
	}
	inProcess := func(name string, fn func() error) error {
		t, cpu := time.Now(), selfCPU()
		err := fn()
		res.Steps = append(res.Steps, Step{Name: name, Wall: time.Since(t), CPU: selfCPU() - cpu})
		return err
	}

	if err := run("skopeo inspect", nil, "skopeo", "inspect", "--tls-verify=false", src); err != nil {
		return nil, err
	}
	if err := run("skopeo inspect --config", nil, "skopeo", "inspect", "--config", "--tls-verify=false", src); err != nil {
		return nil, err
	}
	var scratch string
	if err := inProcess("mkdir", func() error {
		if err := os.MkdirAll(storeDir, 0o755); err != nil {
			return err
		}
		if err := os.MkdirAll(workDir, 0o755); err != nil {
			return err
		}
		var err error
		scratch, err = os.MkdirTemp(storeDir, ".dockerless-rootfs-")
		return err
	}); err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	layout := filepath.Join(scratch, "image")
	if err := run("skopeo copy", nil, "skopeo", "copy", "--src-tls-verify=false", src, "oci:"+layout+":bench"); err != nil {
		return nil, err
	}
	if err := run("umoci unpack", nil, "umoci", "unpack", "--image", layout+":bench", filepath.Join(scratch, "bundle")); err != nil {
		return nil, err
	}
	if err := inProcess("move rootfs", func() error {
		if err := os.RemoveAll(layout); err != nil {
			return err
		}
		if err := os.Rename(filepath.Join(scratch, "bundle", "rootfs"), rootfs); err != nil {
			return err
		}
		return os.RemoveAll(scratch)
	}); err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	if err := inProcess("hooks (envd, CA)", func() error {
		if err := upstreamEnvd(rootfs, j.Envd); err != nil {
			return err
		}
		return upstreamBakeCA(rootfs, j.CAPEM)
	}); err != nil {
		return nil, fmt.Errorf("upstream hooks: %w", err)
	}
	var size int64
	if err := inProcess("size estimate", func() error {
		var data, files int64
		err := filepath.Walk(rootfs, func(_ string, fi fs.FileInfo, err error) error {
			if err != nil {
				return err
			}
			if !fi.IsDir() {
				data += fi.Size()
				files++
			}
			return nil
		})
		size = upstreamSize(data, files)
		return err
	}); err != nil {
		return nil, fmt.Errorf("upstream estimate: %w", err)
	}
	if err := run("truncate", nil, "truncate", "-s", strconv.FormatInt(size, 10), tmp); err != nil {
		return nil, err
	}
	if err := run("mkfs.ext4 -d", nil, "mkfs.ext4", "-F", "-b", "4096", "-d", rootfs, tmp); err != nil {
		return nil, err
	}
	if err := run("e2fsck -fy", []int{0, 1, 2}, "e2fsck", "-fy", tmp); err != nil {
		return nil, err
	}
	if err := run("resize2fs -M", nil, "resize2fs", "-M", tmp); err != nil {
		return nil, err
	}
	fi, err := os.Stat(tmp)
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	if err := run("truncate 2 MiB", nil, "truncate", "-s", strconv.FormatInt(roundUp(fi.Size(), pmemAlign), 10), tmp); err != nil {
		return nil, err
	}
	if err := run("e2fsck -fn", nil, "e2fsck", "-fn", tmp); err != nil {
		return nil, err
	}
	if err := inProcess("rename", func() error { return os.Rename(tmp, final) }); err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	if err := inProcess("sha256", func() error {
		res.SHA256, err = hashFile(ctx, final)
		return err
	}); err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	if err := inProcess("remove rootfs", func() error {
		if err := os.RemoveAll(rootfs); err != nil {
			return err
		}
		return os.RemoveAll(workDir)
	}); err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	res.Wall = time.Since(began)
	res.Image = final
	return res, nil
}

// runTool runs argv under GNU time, accepting the exit codes in okCodes
// (0 when nil), and returns the child's peak RSS and bytes written as time
// reports them. Go starts children with vfork, so the rusage Go gets back
// would include the harness's own RSS in ru_maxrss; time forks normally.
func runTool(ctx context.Context, okCodes []int, argv ...string) (childUsage, error) {
	timeBin, err := lookTool("time")
	if err != nil {
		return childUsage{}, err
	}
	path, err := lookTool(argv[0])
	if err != nil {
		return childUsage{}, err
	}
	usageFile, err := os.CreateTemp("", "tcbench-time-")
	if err != nil {
		return childUsage{}, fmt.Errorf("%s: %w", argv[0], err)
	}
	usageFile.Close()
	defer os.Remove(usageFile.Name())
	args := append([]string{"-f", timeFormat, "-o", usageFile.Name(), path}, argv[1:]...)
	cmd := exec.CommandContext(ctx, timeBin, args...)
	out := &childproc.Output{}
	cmd.Stdout, cmd.Stderr = out, out
	t := time.Now()
	err = cmd.Run()
	u := childUsage{Wall: time.Since(t)}
	if okCodes == nil {
		okCodes = []int{0}
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) && slices.Contains(okCodes, exit.ExitCode()) {
		err = nil
	}
	if err != nil {
		return u, fmt.Errorf("%s: %w\n%s", argv[0], err, images.Tail([]byte(out.String()), 4096))
	}
	report, err := os.ReadFile(usageFile.Name())
	if err != nil {
		return u, fmt.Errorf("%s: read usage: %w", argv[0], err)
	}
	wall := u.Wall
	if u, err = parseTimeUsage(string(report)); err != nil {
		return u, fmt.Errorf("%s: %w", argv[0], err)
	}
	u.Wall = wall
	return u, nil
}

// upstreamEnvd is upstream's envd hook: usr/local/bin/envd, mode 0755,
// owned by the builder (root).
func upstreamEnvd(rootfs string, envd []byte) error {
	if envd == nil {
		return nil
	}
	dir := filepath.Join(rootfs, "usr/local/bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("envd: %w", err)
	}
	p := filepath.Join(dir, "envd")
	if err := os.WriteFile(p, envd, 0o755); err != nil {
		return fmt.Errorf("envd: %w", err)
	}
	return os.Chmod(p, 0o755)
}

// upstreamBakeCA is upstream's egress-CA hook: append to the
// bundles that exist, drop the anchor into the anchor directories that
// exist, seed etc/ssl/certs/ca-certificates.crt when nothing was written.
// Like upstream, it works on host paths of the staged tree.
func upstreamBakeCA(rootfs string, caPEM []byte) error {
	if caPEM == nil {
		return nil
	}
	written := 0
	for _, b := range []string{"etc/ssl/certs/ca-certificates.crt", "etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", "etc/pki/tls/certs/ca-bundle.crt"} {
		p := filepath.Join(rootfs, b)
		old, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if bytes.Contains(old, caPEM) {
			continue
		}
		content := append([]byte(nil), old...)
		if len(content) > 0 && content[len(content)-1] != '\n' {
			content = append(content, '\n')
		}
		content = append(content, caPEM...)
		if err := replaceFile(p, content); err != nil {
			return fmt.Errorf("bake CA: %w", err)
		}
		written++
	}
	for _, d := range []string{"usr/local/share/ca-certificates", "etc/pki/ca-trust/source/anchors", "etc/ca-certificates/trust-source", "system/etc/security/cacerts"} {
		p := filepath.Join(rootfs, d)
		if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
			continue
		}
		if err := os.WriteFile(filepath.Join(p, "cube-egress-root.crt"), caPEM, 0o644); err != nil {
			return fmt.Errorf("bake CA: %w", err)
		}
		written++
	}
	if written == 0 {
		seed := filepath.Join(rootfs, "etc/ssl/certs/ca-certificates.crt")
		if err := os.MkdirAll(filepath.Dir(seed), 0o755); err != nil {
			return fmt.Errorf("bake CA: seed: %w", err)
		}
		if err := os.WriteFile(seed, caPEM, 0o644); err != nil {
			return fmt.Errorf("bake CA: seed: %w", err)
		}
	}
	return nil
}

// replaceFile writes content to a temporary file beside p with p's mode
// and owner, then renames it over p.
func replaceFile(p string, content []byte) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	tmp := p + ".cube-tmp"
	if err := os.WriteFile(tmp, content, fi.Mode().Perm()); err != nil {
		return err
	}
	if err := os.Chmod(tmp, fi.Mode().Perm()); err != nil {
		return err
	}
	if st, ok := statOwner(fi); ok {
		if err := os.Lchown(tmp, st.uid, st.gid); err != nil {
			return err
		}
	}
	return os.Rename(tmp, p)
}

// hashFile is upstream's artifact hash: sha256 through a 4 MiB buffer.
func hashFile(ctx context.Context, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	buf := make([]byte, 4<<20)
	for {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		n, err := f.Read(buf)
		h.Write(buf[:n])
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("hash %s: %w", path, err)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
