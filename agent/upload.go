package agent

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/artifacts"
	"github.com/cubesandbox/cubetemplatecenter/agent/httpobs"
	"github.com/cubesandbox/cubetemplatecenter/agent/space"
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
	// Each upload holds a connection, a file being written and disk
	// bandwidth for as long as it streams: bound them.
	if n := a.uploads.Add(1); n > int64(cfg.Common.MaxConcurrentUploads) {
		a.uploads.Add(-1)
		writeRetryLater(w, http.StatusTooManyRequests, fmt.Sprintf("%d uploads in progress (common.max_concurrent_uploads)", n-1))
		return
	}
	defer a.uploads.Add(-1)
	// Refuse before reading a byte when the store is below its reserve,
	// or the body would take it there.
	if err := space.Named(cfg, space.Store).RoomFor(max(r.ContentLength, 0)); err != nil {
		httpobs.NoteAttrs(w, "content_length", r.ContentLength)
		writeRetryLater(w, http.StatusInsufficientStorage, "upload of "+strconv.FormatInt(r.ContentLength, 10)+" bytes refused: "+err.Error())
		return
	}
	// The server's read and write timeouts are sized for build requests; an
	// image upload is a stream that may take far longer.
	rc := http.NewResponseController(w)
	deadline := time.Now().Add(cfg.Common.UploadTimeout)
	if err := rc.SetReadDeadline(deadline); err != nil {
		a.logger.Warn("extend read deadline for upload", "err", err)
	}
	if err := rc.SetWriteDeadline(deadline); err != nil {
		a.logger.Warn("extend write deadline for upload", "err", err)
	}
	r.Body = http.MaxBytesReader(httpobs.ServerWriter(w), r.Body, int64(cfg.Common.MaxUploadBytes))
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
	if msg, ok := uploadTooBig(err); ok {
		writeError(w, http.StatusRequestEntityTooLarge, msg)
		return
	}
	writeError(w, http.StatusBadRequest, "read upload: "+err.Error())
}

// uploadTooBig recognises the body limit being hit.
func uploadTooBig(err error) (string, bool) {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return fmt.Sprintf("upload exceeds %d bytes", tooBig.Limit), true
	}
	return "", false
}

// receiveArtifact stores one file part as artifact id's image
// (artifacts.Accept) and answers with where it lies.
func (a *Agent) receiveArtifact(w http.ResponseWriter, r *http.Request, id string, part io.Reader) {
	guard := space.Named(a.config(), space.Store).Guard(part)
	acc, err := a.artifacts.Accept(r.Context(), id, guard)
	var writeErr *artifacts.WriteError
	if msg, ok := uploadTooBig(err); ok {
		writeError(w, http.StatusRequestEntityTooLarge, msg)
		return
	}
	switch {
	case errors.As(err, &writeErr) && (errors.Is(err, space.ErrBelowReserve) || errors.Is(err, syscall.ENOSPC)):
		httpobs.NoteAttrs(w, "artifact_id", id, "written", guard.Written)
		writeRetryLater(w, http.StatusInsufficientStorage, err.Error())
		return
	case errors.Is(err, artifacts.ErrEmpty):
		writeError(w, http.StatusBadRequest, "file: empty")
		return
	case errors.Is(err, artifacts.ErrBuilding):
		writeError(w, http.StatusConflict, artifacts.ErrBuilding.Error())
		return
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	reply := uploadReply{Status: "uploaded", ArtifactID: id, Ext4Path: acc.Path, Ext4SHA256: acc.SHA256, Ext4SizeBytes: acc.Size}
	if acc.Reused {
		reply.Status = "reused"
	}
	a.logger.Info("artifact uploaded", "artifact_id", id, "status", reply.Status, "size", acc.Size)
	writeJSON(w, http.StatusOK, reply)
}
