package agent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
	"github.com/cubesandbox/cubetemplatecenter/test/tmpfs"
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

// uploadStream posts an upload whose body comes from a pipe, so it has no
// Content-Length; feed writes the file part's content, then the form is
// closed. It returns the status and the Retry-After header.
func (h *harness) uploadStream(id string, feed func(io.Writer)) (int, string, map[string]any) {
	h.t.Helper()
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		mw.WriteField("artifact_id", id)
		fw, _ := mw.CreateFormFile("file", "image.ext4")
		feed(fw)
		mw.Close()
		pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPost, h.url+"/tc/api/v1/artifact/upload", pr)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set(api.TokenHeader, testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	pr.CloseWithError(io.ErrClosedPipe) // unblock the feeder if the answer came first
	var out map[string]any
	json.Unmarshal(raw, &out)
	return resp.StatusCode, resp.Header.Get("Retry-After"), out
}

// storeEntries lists the store directory, recursively, skipping nothing.
func storeEntries(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if path != dir {
			out = append(out, strings.TrimPrefix(path, dir+"/"))
		}
		return nil
	})
	return out
}

// TestUploadKeepsStoreReserve puts the store on a 16MiB tmpfs with 4MiB
// kept free (store.min_free): an upload whose Content-Length would cross
// the reserve is refused before a byte is written; one without
// Content-Length is stopped when it crosses it, its partial file removed;
// a small one still succeeds.
func TestUploadKeepsStoreReserve(t *testing.T) {
	dir := tmpfs.Mount(t, "16m")
	h := newHarness(t, func(c *config.Config) {
		c.Store.Dir = dir
		c.Store.MinFree = config.Reserve{Bytes: 4 << 20}
	})
	h.start()
	big := bytes.Repeat([]byte("x"), 14<<20)

	id := "rfs-0123456789abcdef01234567"
	code, body := h.upload(&id, big)
	if code != http.StatusInsufficientStorage || !strings.Contains(fmt.Sprint(body["error"]), "store.min_free") {
		t.Errorf("upload with a Content-Length crossing the reserve = %d %v; want 507 naming store.min_free", code, body)
	}
	if got := storeEntries(t, dir); len(got) != 0 {
		t.Errorf("store after the refused upload holds %v; want nothing", got)
	}

	code, retry, body := h.uploadStream(id, func(w io.Writer) { w.Write(big) })
	if code != http.StatusInsufficientStorage || retry == "" || !strings.Contains(fmt.Sprint(body["error"]), "store.min_free") {
		t.Errorf("streamed upload crossing the reserve = %d (Retry-After %q) %v; want 507 with a Retry-After naming store.min_free", code, retry, body)
	}
	if got := storeEntries(t, dir); len(got) != 0 {
		t.Errorf("store after the stopped upload holds %v; want the partial file removed", got)
	}

	small := bytes.Repeat([]byte("y"), 1<<20)
	if code, body := h.upload(&id, small); code != http.StatusOK || body["status"] != "uploaded" {
		t.Errorf("small upload = %d %v; want 200 uploaded", code, body)
	}
}

// TestUploadConcurrencyBound: with common.max_concurrent_uploads 1, a
// second upload while one streams is answered 429 with a Retry-After, and
// the slot is free again once the first ends.
func TestUploadConcurrencyBound(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Common.MaxConcurrentUploads = 1 })
	h.start()
	first := "rfs-0123456789abcdef01234567"
	other := "rfs-76543210fedcba9876543210"
	proceed := make(chan struct{})
	done := make(chan int, 1)
	go func() {
		code, _, _ := h.uploadStream(first, func(w io.Writer) {
			w.Write([]byte("first part of the image "))
			<-proceed
			w.Write([]byte("and the rest"))
		})
		done <- code
	}()
	// The first upload is in the handler once its temporary file exists.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if entries, _ := os.ReadDir(filepath.Join(h.cfg.Store.Dir, first)); len(entries) > 0 {
			break
		}
		if time.Now().After(deadline) {
			close(proceed)
			t.Fatal("the first upload never started writing")
		}
	}
	code, retry, body := h.uploadStream(other, func(w io.Writer) { w.Write([]byte("second image")) })
	if code != http.StatusTooManyRequests || retry == "" {
		t.Errorf("upload beyond the bound = %d (Retry-After %q) %v; want 429 with a Retry-After", code, retry, body)
	}
	if _, err := os.Stat(filepath.Join(h.cfg.Store.Dir, other)); err == nil {
		t.Errorf("the refused upload left %s in the store", other)
	}
	close(proceed)
	if code := <-done; code != http.StatusOK {
		t.Errorf("first upload = %d, want 200", code)
	}
	if code, _, body := h.uploadStream(other, func(w io.Writer) { w.Write([]byte("second image")) }); code != http.StatusOK {
		t.Errorf("upload after the first ended = %d %v, want 200", code, body)
	}
}
