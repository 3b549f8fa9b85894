package agent

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/agent/api"
	"github.com/cubesandbox/cubetemplatecenter/agent/artifacts"
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
	if err := volumeNamed(cfg, "store").roomFor(max(r.ContentLength, 0)); err != nil {
		noteAttrs(w, "content_length", r.ContentLength)
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
	r.Body = http.MaxBytesReader(serverWriter(w), r.Body, int64(cfg.Common.MaxUploadBytes))
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

// errBelowReserve stops an upload whose writes took the store below
// store.min_free.
var errBelowReserve = errors.New("store below its reserve")

// reserveCheckEvery is how many bytes an upload writes between two looks at
// the store's free space: small beside any reserve worth setting, large
// beside a statfs call.
const reserveCheckEvery = 1 << 20

// reserveWriter writes an upload to the store and stops it once the store
// falls below its reserve (a body without Content-Length, another writer
// filling the disk meanwhile).
type reserveWriter struct {
	w       io.Writer
	vol     volume
	written int64
	checked int64
}

func (rw *reserveWriter) Write(p []byte) (int, error) {
	if rw.written-rw.checked >= reserveCheckEvery || rw.written == 0 {
		rw.checked = rw.written
		if err := rw.vol.roomFor(int64(len(p))); err != nil {
			return 0, fmt.Errorf("%w: %w", errBelowReserve, err)
		}
	}
	n, err := rw.w.Write(p)
	rw.written += int64(n)
	return n, err
}

// receiveArtifact streams one file part into the store. The file is written
// and hashed, and an image already in place compared, before the artifact
// lock is taken: the lock, which build starts wait on, covers the rename
// alone.
func (a *Agent) receiveArtifact(w http.ResponseWriter, r *http.Request, id string, part io.Reader) {
	f, err := a.store.CreateTemp(id)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	handedOver := false
	defer func() {
		if !handedOver {
			a.store.Discard(f, id)
		}
	}()
	guard := &reserveWriter{w: f, vol: volumeNamed(a.config(), "store")}
	sum, size, err := rootfs.CopyHashed(r.Context(), guard, part)
	if err != nil {
		if msg, ok := uploadTooBig(err); ok {
			writeError(w, http.StatusRequestEntityTooLarge, msg)
			return
		}
		if errors.Is(err, errBelowReserve) || errors.Is(err, syscall.ENOSPC) {
			noteAttrs(w, "artifact_id", id, "written", guard.written)
			writeRetryLater(w, http.StatusInsufficientStorage, "store upload: "+err.Error())
			return
		}
		writeError(w, http.StatusInternalServerError, "store upload: "+err.Error())
		return
	}
	if size == 0 {
		writeError(w, http.StatusBadRequest, "file: empty")
		return
	}
	final := a.store.ArtifactPath(id)
	reply := uploadReply{Status: "uploaded", ArtifactID: id, Ext4Path: final, Ext4SHA256: sum, Ext4SizeBytes: size}
	if fi, err := os.Stat(final); err == nil && fi.Mode().IsRegular() && fi.Size() == size {
		if have, err := rootfs.FileSHA256(r.Context(), final); err == nil && have == sum {
			reply.Status = "reused"
		}
	}
	if reply.Status == "uploaded" {
		if err := f.Chmod(0o644); err != nil {
			writeError(w, http.StatusInternalServerError, "store upload: "+err.Error())
			return
		}
		var pubErr error
		handedOver, pubErr = a.artifacts.Install(f, id)
		if !handedOver {
			writeError(w, http.StatusConflict, artifacts.ErrBuilding.Error())
			return
		}
		if pubErr != nil {
			writeError(w, http.StatusInternalServerError, pubErr.Error())
			return
		}
	}
	a.logger.Info("artifact uploaded", "artifact_id", id, "status", reply.Status, "size", size)
	writeJSON(w, http.StatusOK, reply)
}
