package main

import (
	"archive/tar"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/test/cubemaster"
	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// maxAgentRSS is the bound on the agent's peak memory, whatever an image
// holds, with the default limits.
const maxAgentRSS = 512 << 20

// hostileLayer is a tar stream a crafted image carries.
type hostileLayer func(tw *tar.Writer) error

// streamed turns a hostile tar stream into a layer compressed as it is
// written, so the test never holds a decompression bomb whole.
func streamed(c images.Compression, gen hostileLayer) images.Layer {
	return images.Layer{Compression: c, Stream: func(w io.Writer) error {
		tw := tar.NewWriter(w)
		if err := gen(tw); err != nil {
			return err
		}
		return tw.Close()
	}}
}

// zeros writes a file of size zero bytes.
func zeros(tw *tar.Writer, name string, size int64) error {
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size}); err != nil {
		return err
	}
	_, err := io.CopyN(tw, zeroReader{}, size)
	return err
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// peakRSS is the process's peak resident set (VmHWM), in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read agent status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("parse VmHWM %q: %v", line, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// TestHostileImagesBoundedMemory builds crafted images through the agent
// binary, one after the other: each fails with a message naming what it
// hit, the agent's peak memory stays under maxAgentRSS, nothing is left in
// the store, and a normal image builds afterwards.
func TestHostileImagesBoundedMemory(t *testing.T) {
	t.Parallel()
	cm := startCubeMaster(t, testToken)
	reg := images.StartRegistry(t, nil)
	h := newHarness(t, cm.URL(), testToken)
	caPath := filepath.Join(h.dir, "ca.crt")
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: images.NewCACert(t, "hostile-test egress CA")})
	if err := os.WriteFile(caPath, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	h.set("build.ca_path", caPath)
	h.set("registry.insecure", []string{reg.Host})
	h.set("build.max_concurrent_builds", 1)
	// Below the default 64 GiB so the bomb below need not be that large;
	// the CA bundle's 512 MiB still fit.
	h.set("build.max_image_size", "1GiB")
	agent := h.startAgent("agent (hostile images)")
	pid := agent.cmd.Process.Pid
	base := peakRSS(t, pid)

	cases := []struct {
		name  string
		layer images.Layer
		want  []string
	}{
		{"Deep", streamed(images.Gzip, func(tw *tar.Writer) error {
			// One entry 400,000 directories deep: under 1 KiB of gzip.
			return tw.WriteHeader(&tar.Header{Name: strings.Repeat("d/", 400_000) + "f", Typeflag: tar.TypeReg, Mode: 0o644, Format: tar.FormatPAX})
		}), []string{"layer 0", "name longer than 4095 bytes"}},
		{"HugeXattrs", streamed(images.Gzip, func(tw *tar.Writer) error {
			for i := range 300 {
				hdr := &tar.Header{Name: fmt.Sprintf("x%03d", i), Typeflag: tar.TypeReg, Mode: 0o644, Format: tar.FormatPAX,
					PAXRecords: map[string]string{"SCHILY.xattr.user.big": strings.Repeat("x", 1000_000)}}
				if err := tw.WriteHeader(hdr); err != nil {
					return err
				}
			}
			return nil
		}), []string{`entry "x000"`, "do not fit in the inode"}},
		{"HugeCABundle", streamed(images.Zstd, func(tw *tar.Writer) error {
			return zeros(tw, "etc/ssl/certs/ca-certificates.crt", 512<<20)
		}), []string{"ca-certificates.crt", "limit for files read whole"}},
		{"ManyFiles", streamed(images.Gzip, func(tw *tar.Writer) error {
			// Past the default 192 MiB build.max_tree_memory (about
			// 300,000 such entries) with room to spare.
			for i := range 400_000 {
				if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("d%03d/f%06d", i/1000, i), Typeflag: tar.TypeReg, Mode: 0o644}); err != nil {
					return err
				}
			}
			return nil
		}), []string{"layer 0", "build.max_tree_memory"}},
		{"Bomb", streamed(images.Zstd, func(tw *tar.Writer) error {
			return zeros(tw, "bomb", 1536<<20)
		}), []string{`entry "bomb"`, "build.max_image_size"}},
	}
	for _, c := range cases {
		ref := reg.Push(t, "hostile/"+strings.ToLower(c.name)+":v1", images.New(t, images.Config{}, c.layer))
		jobID := "hostile-" + strings.ToLower(c.name)
		submitBody(t, h.baseURL(), jobID, ref)
		cb := waitTerminal(t, cm, jobID)
		msg := cb.Field("error_message")
		if cb.Field("status") != "FAILED" {
			t.Errorf("%s: terminal report %s, want FAILED", c.name, cb.Field("status"))
		}
		for _, want := range c.want {
			if !strings.Contains(msg, want) {
				t.Errorf("%s: error_message %.300q does not say %q", c.name, msg, want)
			}
		}
		if len(msg) > 2048 {
			t.Errorf("%s: error_message is %d bytes long", c.name, len(msg))
		}
		rss := peakRSS(t, pid)
		t.Logf("%s: peak RSS %d MiB after the build (at start %d MiB)", c.name, rss>>20, base>>20)
		if rss > maxAgentRSS {
			t.Errorf("%s: the agent's peak RSS reached %d MiB, over %d MiB", c.name, rss>>20, maxAgentRSS>>20)
		}
		checkStoreHoldsOnly(t, filepath.Join(h.dir, "store"))
	}

	ref := reg.Push(t, "hostile/normal:v1", images.New(t, images.Config{}, images.Layer{Tar: images.TarOf(t, map[string]string{"etc/hostname": "after"})}))
	submitBody(t, h.baseURL(), "hostile-then-normal", ref)
	if cb := waitTerminal(t, cm, "hostile-then-normal"); cb.Field("status") != "BUILT" {
		t.Errorf("a normal build after the hostile ones ended %s: %s", cb.Field("status"), cb.Field("error_message"))
	}
	agent.stop(t)
}

// submitBody submits a build of image that bakes the egress CA.
func submitBody(t *testing.T, base, jobID, image string) {
	t.Helper()
	body, err := json.Marshal(cubemaster.BuildRequest(jobID, image, map[string]any{"with_cube_ca": true}))
	if err != nil {
		t.Fatal(err)
	}
	if code, resp := call(t, "POST", base+"/tc/api/v1/build", testToken, body); code != 200 {
		t.Fatalf("submit %s = %d %v", jobID, code, resp)
	}
}

// checkStoreHoldsOnly fails if the store holds anything but published
// artifacts: a failed build leaves no temporary image or empty directory.
func checkStoreHoldsOnly(t *testing.T, store string) {
	t.Helper()
	entries, _ := os.ReadDir(store)
	for _, e := range entries {
		files, _ := os.ReadDir(filepath.Join(store, e.Name()))
		if len(files) != 1 || files[0].Name() != e.Name()+".ext4" {
			t.Errorf("store entry %s holds %v after a failed build", e.Name(), files)
		}
	}
}
