package agent

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/rootfs"
)

// uploadReply is upstream's UploadArtifactResponse.
type uploadReply struct {
	Status        string `json:"status"`
	ArtifactID    string `json:"artifact_id"`
	Ext4Path      string `json:"ext4_path"`
	Ext4SHA256    string `json:"ext4_sha256"`
	Ext4SizeBytes int64  `json:"ext4_size_bytes"`
}

// handleArtifactUpload stores an ext4 image CubeMaster sends (template merge
// and migration): multipart form field artifact_id, then file part file. The
// file streams straight to a temporary name beside its final path while it
// is hashed, so nothing is buffered or copied twice; an identical image
// already in place is kept ("reused").
func (a *Agent) handleArtifactUpload(w http.ResponseWriter, r *http.Request) {
	cfg := a.config()
	// The server's read timeout is sized for build requests; an image upload
	// may take far longer.
	if err := http.NewResponseController(w).SetReadDeadline(time.Now().Add(cfg.Common.UploadTimeout)); err != nil {
		a.logger.Warn("extend read deadline for upload", "err", err)
	}
	r.Body = http.MaxBytesReader(w, r.Body, int64(cfg.Common.MaxUploadBytes))
	mediaType, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mediaType != "multipart/form-data" || params["boundary"] == "" {
		writeError(w, http.StatusBadRequest, "want a multipart/form-data body with fields artifact_id and file")
		return
	}
	mr := multipart.NewReader(r.Body, params["boundary"])
	id := ""
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			a.uploadReadError(w, err)
			return
		}
		switch part.FormName() {
		case "artifact_id":
			v, err := io.ReadAll(io.LimitReader(part, 256))
			if err != nil {
				a.uploadReadError(w, err)
				return
			}
			id = strings.TrimSpace(string(v))
		case "file":
			if id == "" {
				writeError(w, http.StatusBadRequest, "artifact_id: required before the file part")
				return
			}
			if !api.ValidArtifactID(id) {
				writeError(w, http.StatusBadRequest, "artifact_id: not a plain artifact id")
				return
			}
			a.receiveArtifact(w, r, id, part)
			return
		}
		part.Close()
	}
	if id == "" {
		writeError(w, http.StatusBadRequest, "artifact_id: required")
		return
	}
	writeError(w, http.StatusBadRequest, "file: required")
}

func (a *Agent) uploadReadError(w http.ResponseWriter, err error) {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("upload exceeds %d bytes", tooBig.Limit))
		return
	}
	writeError(w, http.StatusBadRequest, "read upload: "+err.Error())
}

// receiveArtifact streams one file part into the store.
func (a *Agent) receiveArtifact(w http.ResponseWriter, r *http.Request, id string, part io.Reader) {
	var reply *uploadReply
	var status int
	var msg string
	ran := a.exec.withArtifactIdle(id, func() {
		reply, status, msg = a.storeUpload(r, id, part)
	})
	switch {
	case !ran:
		writeError(w, http.StatusConflict, "artifact is being built")
	case reply == nil:
		writeError(w, status, msg)
	default:
		a.logger.Info("artifact uploaded", "artifact_id", id, "status", reply.Status, "size", reply.Ext4SizeBytes)
		writeJSON(w, http.StatusOK, reply)
	}
}

func (a *Agent) storeUpload(r *http.Request, id string, part io.Reader) (*uploadReply, int, string) {
	f, err := a.store.CreateTemp(id)
	if err != nil {
		return nil, http.StatusInternalServerError, err.Error()
	}
	published := false
	defer func() {
		if !published {
			a.store.Discard(f, id)
		}
	}()
	sum, size, err := rootfs.CopyHashed(r.Context(), f, part)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, http.StatusRequestEntityTooLarge, fmt.Sprintf("upload exceeds %d bytes", tooBig.Limit)
		}
		return nil, http.StatusInternalServerError, "store upload: " + err.Error()
	}
	if size == 0 {
		return nil, http.StatusBadRequest, "file: empty"
	}
	final := a.store.ArtifactPath(id)
	reply := &uploadReply{ArtifactID: id, Ext4Path: final, Ext4SHA256: sum, Ext4SizeBytes: size}
	if fi, err := os.Stat(final); err == nil && fi.Mode().IsRegular() && fi.Size() == size {
		if have, err := rootfs.FileSHA256(r.Context(), final); err == nil && have == sum {
			reply.Status = "reused"
			return reply, 0, ""
		}
	}
	if err := f.Chmod(0o644); err != nil {
		return nil, http.StatusInternalServerError, "store upload: " + err.Error()
	}
	if err := a.store.Publish(f, id); err != nil {
		return nil, http.StatusInternalServerError, err.Error()
	}
	published = true
	reply.Status = "uploaded"
	return reply, 0, ""
}
