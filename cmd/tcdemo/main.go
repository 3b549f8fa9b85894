// Command tcdemo shows CubeTemplateCenter end to end on one machine, with no
// network: it generates a small sample image, serves it from an in-process
// OCI registry, starts a CubeMaster stand-in and the templatecenter agent,
// submits a build the way CubeMaster does, and prints the result and where
// the template image landed.
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cubesandbox/cubetemplatecenter/test/childproc"
	"github.com/cubesandbox/cubetemplatecenter/test/cubemaster"
)

const token = "demo-shared-token"

func main() {
	binary := flag.String("templatecenter", "bin/templatecenter", "agent binary to run")
	out := flag.String("out", ".demo", "directory for the store, spool and logs (emptied first)")
	flag.Parse()
	if err := run(*binary, *out); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(binary, out string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := filepath.Abs(out)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(out); err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}

	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	ref := strings.TrimPrefix(reg.URL, "http://") + "/demo/hello:1.0"
	if err := pushSample(ctx, ref); err != nil {
		return fmt.Errorf("push sample image: %w", err)
	}
	fmt.Printf("1. sample image pushed to an in-process registry: %s\n", ref)

	master, err := cubemaster.Start(token)
	if err != nil {
		return err
	}
	defer master.Stop()
	fmt.Printf("2. CubeMaster stand-in listening at %s\n", master.URL())

	caPath := filepath.Join(out, "cube-root-ca.crt")
	if err := writeDemoCA(caPath); err != nil {
		return fmt.Errorf("create demo egress CA: %w", err)
	}
	addr, err := childproc.FreeLoopbackAddr()
	if err != nil {
		return err
	}
	_, port, _ := net.SplitHostPort(addr)
	conf := filepath.Join(out, "conf.yaml")
	yaml := fmt.Sprintf("common:\n  http_bind: 127.0.0.1\n  http_port: %s\nstore:\n  dir: %s\n  work_dir: %s\nspool:\n  path: %s\nbuild:\n  ca_path: %s\nregistry:\n  insecure: [%q]\n",
		port, filepath.Join(out, "store"), filepath.Join(out, "work"), filepath.Join(out, "state", "spool.db"),
		caPath, strings.TrimPrefix(reg.URL, "http://"))
	if err := os.WriteFile(conf, []byte(yaml), 0o644); err != nil {
		return err
	}
	logPath := filepath.Join(out, "agent.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	agent := exec.Command(binary)
	agent.Env = append(os.Environ(), "CUBE_TEMPLATE_CENTER_CONFIG_PATH="+conf, "CUBE_MASTER_ADDR="+master.URL(),
		"CUBE_TEMPLATE_CALLBACK_TOKEN="+token)
	agent.Stdout, agent.Stderr = logFile, logFile
	if err := agent.Start(); err != nil {
		return fmt.Errorf("start %s (run make build first): %w", binary, err)
	}
	exited := make(chan struct{})
	go func() {
		agent.Wait()
		close(exited)
	}()
	defer func() {
		agent.Process.Signal(syscall.SIGTERM)
		<-exited
	}()
	base := "http://" + addr
	// An agent that exits (a bad config, a port taken) ends the wait at
	// once, naming its log, instead of after the minute.
	if err := childproc.WaitHTTP(ctx, base+"/health", exited, time.Minute); err != nil {
		return fmt.Errorf("agent: %w (log: %s)", err, logPath)
	}
	fmt.Printf("3. templatecenter agent (pid %d) healthy at %s, log in %s\n", agent.Process.Pid, base, logPath)

	jobID := fmt.Sprintf("demo-%d", time.Now().Unix())
	body, err := json.Marshal(map[string]any{
		"job_id": jobID, "download_base_url": master.URL(),
		"request": map[string]any{"requestID": "demo", "source_image_ref": "http://" + ref, "writable_layer_size": "1Gi",
			"instance_type": "cubebox", "network_type": "tap", "template_id": "tpl-demo"},
	})
	if err != nil {
		return fmt.Errorf("encode build request: %w", err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/tc/api/v1/build", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Cube-Template-Callback-Token", token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("submit build: %w", err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Printf("4. POST /tc/api/v1/build -> %d %s", resp.StatusCode, answer)
	if resp.StatusCode != http.StatusOK {
		return errors.New("build was not accepted")
	}

	final, err := master.WaitTerminal(ctx, jobID)
	if err != nil {
		return fmt.Errorf("%w (agent log: %s)", err, logPath)
	}
	fmt.Println("5. status reports CubeMaster received:")
	for _, c := range master.Callbacks(jobID) {
		line, err := json.Marshal(c.Body)
		if err != nil {
			return fmt.Errorf("encode report of %s: %w", jobID, err)
		}
		fmt.Printf("   %s\n", line)
	}
	if final.Field("status") != "BUILT" {
		return fmt.Errorf("build ended %s: %s", final.Field("status"), final.Field("error_message"))
	}
	path := final.Field("ext4_path")
	fmt.Printf("6. template image: %s (%d bytes, sha256 %s)\n", path, final.Int("ext4_size_bytes"), final.Field("ext4_sha256"))
	inspect := exec.CommandContext(ctx, binary, "inspect", path, "/")
	inspect.Stdout, inspect.Stderr = os.Stdout, os.Stderr
	fmt.Println("7. templatecenter inspect " + path + " /")
	if err := inspect.Run(); err != nil {
		return fmt.Errorf("inspect: %w", err)
	}
	return nil
}

// pushSample builds a two-layer image: a base with a small filesystem and
// an upper layer that overwrites, deletes (whiteout) and adds files.
func pushSample(ctx context.Context, ref string) error {
	base, err := layer(func(tw *tar.Writer) {
		dir(tw, "bin", 0o755)
		dir(tw, "etc", 0o755)
		file(tw, "etc/os-release", 0o644, "NAME=\"Cube demo\"\nID=cubedemo\n")
		file(tw, "etc/motd", 0o644, "this file is deleted by the upper layer\n")
		file(tw, "bin/hello", 0o755, string(helloELF()))
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/hi", Linkname: "hello", Mode: 0o777})
	})
	if err != nil {
		return err
	}
	upper, err := layer(func(tw *tar.Writer) {
		dir(tw, "etc", 0o755)
		file(tw, "etc/.wh.motd", 0o644, "")
		file(tw, "etc/os-release", 0o644, "NAME=\"Cube demo\"\nID=cubedemo\nVERSION_ID=1.0\n")
		dir(tw, "app", 0o755)
		file(tw, "app/README", 0o644, "built by CubeTemplateCenter from an OCI image\n")
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), base, upper)
	if err != nil {
		return err
	}
	img, err = mutate.Config(img, v1.Config{Cmd: []string{"/bin/hello"}, Env: []string{"PATH=/bin"}, WorkingDir: "/app"})
	if err != nil {
		return err
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return err
	}
	return remote.Write(r, img, remote.WithContext(ctx))
}

func layer(fill func(*tar.Writer)) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	fill(tw)
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer))
}

var demoTime = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func dir(tw *tar.Writer, name string, mode int64) {
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, ModTime: demoTime})
}

func file(tw *tar.Writer, name string, mode int64, content string) {
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(content)), ModTime: demoTime})
	tw.Write([]byte(content))
}

// writeDemoCA creates a throwaway self-signed root CA standing in for the
// CubeEgress CA that the agent bakes into templates.
func writeDemoCA(path string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "Cube demo egress root CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}
