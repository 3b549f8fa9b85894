package rootfs

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/internal/fsutil"
)

// Store is the artifact directory shared with CubeMaster: each artifact is
// <store>/<artifact_id>/<artifact_id>.ext4.
type Store string

// ArtifactDir is the directory holding one artifact.
func (s Store) ArtifactDir(id string) string { return filepath.Join(string(s), id) }

// ArtifactPath is where an artifact's image is published.
func (s Store) ArtifactPath(id string) string {
	return filepath.Join(string(s), id, id+".ext4")
}

// tempMarker tags temporary files with the host that wrote them, so the
// cleanup at boot never touches a file another host's agent is writing on a
// shared store.
func tempMarker() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	return ".tmp-" + strings.ReplaceAll(host, "/", "_") + "-"
}

// CreateTemp creates the temporary file an artifact is built into, beside
// its final path so the publishing rename stays on one filesystem.
func (s Store) CreateTemp(id string) (*os.File, error) {
	dir := s.ArtifactDir(id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create artifact directory: %w", err)
	}
	var r [6]byte
	rand.Read(r[:])
	path := filepath.Join(dir, id+".ext4"+tempMarker()+hex.EncodeToString(r[:]))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create temporary image: %w", err)
	}
	return f, nil
}

// Commit makes a finished temporary image the artifact: fsync, rename over
// the final name, fsync the directory. f is closed in every case, and the
// temporary file is removed when the commit fails.
func (s Store) Commit(f *os.File, id string) (err error) {
	tmp := f.Name()
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync image: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close image: %w", err)
	}
	if err := os.Rename(tmp, s.ArtifactPath(id)); err != nil {
		return fmt.Errorf("publish image: %w", err)
	}
	if err := fsutil.SyncDir(s.ArtifactDir(id)); err != nil {
		return err
	}
	// The artifact directory may be new: make its entry in the store
	// durable too.
	return fsutil.SyncDir(string(s))
}

// Discard removes a temporary image after a failed build, and the artifact
// directory too when nothing else is left in it.
func (s Store) Discard(f *os.File, id string) {
	f.Close()
	os.Remove(f.Name())
	os.Remove(s.ArtifactDir(id)) // only succeeds when empty
}

// CleanLeftovers removes what a crash of this host's agent can leave in the
// store: temporary images it was writing and artifact directories left
// empty. Published images and other hosts' files are never touched. It
// returns the paths it removed.
func (s Store) CleanLeftovers() ([]string, error) {
	marker := tempMarker()
	entries, err := os.ReadDir(string(s))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("scan store: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "rfs-") {
			continue
		}
		dir := s.ArtifactDir(e.Name())
		files, err := os.ReadDir(dir)
		if err != nil {
			errs = append(errs, fmt.Errorf("scan %s: %w", dir, err))
			continue
		}
		left := len(files)
		for _, f := range files {
			if f.Type().IsRegular() && strings.Contains(f.Name(), ".ext4"+marker) {
				p := filepath.Join(dir, f.Name())
				if err := os.Remove(p); err != nil {
					errs = append(errs, fmt.Errorf("remove leftover %s: %w", p, err))
					continue
				}
				removed = append(removed, p)
				left--
			}
		}
		if left == 0 && os.Remove(dir) == nil {
			removed = append(removed, dir)
		}
	}
	return removed, errors.Join(errs...)
}

// ErrNotArtifact reports that what stands at an artifact's place in the
// store is not only that artifact (a file, a link, or a directory holding
// other entries), so it is left alone.
var ErrNotArtifact = errors.New("not an artifact directory")

// RemoveArtifact deletes an artifact's directory: its image and temporary
// images, then the directory itself. It refuses, with ErrNotArtifact and
// touching nothing, when the place holds anything else: a non-directory, a
// symlink, or an entry that is not the image or one of its temporary files.
// A missing directory is success.
func (s Store) RemoveArtifact(id string) error {
	dir := s.ArtifactDir(id)
	fi, err := os.Lstat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("inspect %s: %w", dir, err)
	case !fi.IsDir():
		return fmt.Errorf("remove %s: %w: it is a %s", dir, ErrNotArtifact, kindOf(fi.Mode()))
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("scan %s: %w", dir, err)
	}
	var foreign []string
	for _, e := range entries {
		if !e.Type().IsRegular() || !isArtifactFile(id, e.Name()) {
			foreign = append(foreign, e.Name())
		}
	}
	if len(foreign) > 0 {
		if len(foreign) > 5 {
			foreign = append(foreign[:5], fmt.Sprintf("and %d more", len(foreign)-5))
		}
		return fmt.Errorf("remove %s: %w: it holds %s", dir, ErrNotArtifact, strings.Join(foreign, ", "))
	}
	// Entry by entry, never RemoveAll: whatever appears meanwhile makes
	// the final rmdir fail instead of being deleted unseen.
	for _, e := range entries {
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", filepath.Join(dir, e.Name()), err)
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return fsutil.SyncDir(string(s))
}

// isArtifactFile reports whether name is the artifact's image or a
// temporary image of it (written by any host).
func isArtifactFile(id, name string) bool {
	return name == id+".ext4" || strings.HasPrefix(name, id+".ext4.tmp-")
}

func kindOf(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m.IsRegular():
		return "regular file"
	default:
		return "special file"
	}
}

// CopyHashed copies src to dst while hashing it, stopping when ctx ends. It
// returns the SHA-256 (hex) and length of what was copied.
func CopyHashed(ctx context.Context, dst io.Writer, src io.Reader) (string, int64, error) {
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(dst, h), fsutil.ContextReader(ctx, src))
	if err != nil {
		return "", n, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}
