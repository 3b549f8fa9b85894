package agent

import (
	"bytes"
	"io"
	"mime/multipart"
	"net/http"
	"testing"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/config"
)

// slowPost sends body in two halves with a pause between them, so the
// request takes longer than the write timeout, and returns the status, or
// an error when the agent could not answer in time.
func slowPost(t *testing.T, url, contentType string, body []byte, pause time.Duration) (int, error) {
	t.Helper()
	pr, pw := io.Pipe()
	go func() {
		pw.Write(body[:len(body)/2])
		time.Sleep(pause)
		pw.Write(body[len(body)/2:])
		pw.Close()
	}()
	req, err := http.NewRequest(http.MethodPost, url, pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(body))
	req.Header.Set("Content-Type", contentType)
	req.Header.Set(api.TokenHeader, testToken)
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.ReadAll(resp.Body); err != nil {
		return 0, err
	}
	return resp.StatusCode, nil
}

// TestWriteTimeoutSparesUploads: a request that takes longer than
// common.write_timeout gets no answer, except an upload, which is a stream
// with its own deadline.
func TestWriteTimeoutSparesUploads(t *testing.T) {
	h := newHarness(t, func(c *config.Config) { c.Common.WriteTimeout = 300 * time.Millisecond })
	h.start()
	pause := time.Second

	if code, err := slowPost(t, h.url+"/tc/api/v1/build", "application/json", []byte(`{"job_id":"slow","request":{}}`), pause); err == nil {
		t.Errorf("a slow non-stream request was answered %d after the write timeout", code)
	}

	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	mw.WriteField("artifact_id", "rfs-0123456789abcdef01234567")
	fw, _ := mw.CreateFormFile("file", "image.ext4")
	fw.Write(bytes.Repeat([]byte("ext4 bytes "), 5000))
	mw.Close()
	code, err := slowPost(t, h.url+"/tc/api/v1/artifact/upload", mw.FormDataContentType(), body.Bytes(), pause)
	if err != nil || code != http.StatusOK {
		t.Errorf("slow upload = %d, %v; want 200: uploads extend their write deadline", code, err)
	}
}
