package agent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
)

// upload posts a multipart body; fields are written in the order given
// and a nil file leaves the file part out.
func (h *harness) upload(id *string, file []byte) (int, map[string]any) {
	h.t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	if id != nil {
		mw.WriteField("artifact_id", *id)
	}
	if file != nil {
		fw, _ := mw.CreateFormFile("file", "image.ext4")
		fw.Write(file)
	}
	mw.Close()
	req, _ := http.NewRequest(http.MethodPost, h.url+"/tc/api/v1/artifact/upload", &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set(api.TokenHeader, testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	json.Unmarshal(raw, &out)
	return resp.StatusCode, out
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestArtifactUpload(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Common.MaxUploadBytes = 1 << 20 })
	h.start()
	id := "rfs-0123456789abcdef01234567"
	image := bytes.Repeat([]byte("ext4 bytes "), 5000)
	code, body := h.upload(&id, image)
	path := filepath.Join(h.cfg.Store.Dir, id, id+".ext4")
	if code != 200 || body["status"] != "uploaded" || body["ext4_path"] != path || body["ext4_sha256"] != sum(image) ||
		body["ext4_size_bytes"] != float64(len(image)) || body["artifact_id"] != id {
		t.Fatalf("upload = %d %v", code, body)
	}
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, image) {
		t.Fatalf("stored file differs (%v)", err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o644 {
		t.Errorf("mode = %v, want 0644", fi.Mode().Perm())
	}
	if code, body = h.upload(&id, image); code != 200 || body["status"] != "reused" {
		t.Errorf("same upload again = %d %v, want reused", code, body)
	}
	other := append([]byte("changed "), image...)
	if code, body = h.upload(&id, other); code != 200 || body["status"] != "uploaded" || body["ext4_sha256"] != sum(other) {
		t.Errorf("different upload = %d %v, want uploaded", code, body)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, other) {
		t.Error("replacement not stored")
	}

	bad := func(name string, id *string, file []byte, want int, msg string) {
		t.Helper()
		code, body := h.upload(id, file)
		if code != want || !strings.Contains(body["error"].(string), msg) {
			t.Errorf("%s: %d %v, want %d %q", name, code, body, want, msg)
		}
	}
	traversal, blank := "../outside", ""
	bad("NoID", nil, image, 400, "artifact_id: required")
	bad("BlankID", &blank, image, 400, "artifact_id: required")
	bad("Traversal", &traversal, image, 400, "not a plain artifact id")
	bad("NoFile", &id, nil, 400, "file: required")
	bad("EmptyFile", &id, []byte{}, 400, "file: empty")
	bad("TooBig", &id, make([]byte, 2<<20), 413, "exceeds")
	if _, err := os.Stat(filepath.Join(h.cfg.Store.Dir, "..", "outside")); !os.IsNotExist(err) {
		t.Error("a traversal upload wrote outside the store")
	}
	entries, _ := os.ReadDir(filepath.Join(h.cfg.Store.Dir, id))
	if len(entries) != 1 {
		t.Errorf("artifact dir holds %d entries after failed uploads, want only the image", len(entries))
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, other) {
		t.Error("a failed upload damaged the published image")
	}
	code, body = h.post("/tc/api/v1/artifact/upload", map[string]any{"artifact_id": id})
	if code != 400 || !strings.Contains(body["error"].(string), "multipart") {
		t.Errorf("JSON upload = %d %v, want 400", code, body)
	}
	if code, _ := h.postWithToken("/tc/api/v1/artifact/upload", []byte("x"), "wrong"); code != 401 {
		t.Errorf("upload with a wrong token = %d, want 401", code)
	}
}

func TestArtifactUploadWhileBuilding(t *testing.T) {
	h := newHarness(t, nil)
	entered, release := h.pauseAtPublish()
	h.start()
	h.submit("building", "img")
	id := <-entered
	code, body := h.upload(&id, []byte("an image CubeMaster sends"))
	close(release)
	if code != http.StatusConflict {
		t.Errorf("upload during a build of the same artifact = %d %v, want 409", code, body)
	}
	cb := h.terminal("building")
	got, err := os.ReadFile(cb.Field("ext4_path"))
	if err != nil || string(got) == "an image CubeMaster sends" {
		t.Errorf("the refused upload replaced the built image (%v)", err)
	}
	entries, _ := os.ReadDir(filepath.Join(h.cfg.Store.Dir, id))
	if len(entries) != 1 {
		t.Errorf("artifact dir holds %d entries, want only the built image", len(entries))
	}
}
