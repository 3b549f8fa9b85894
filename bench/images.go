package bench

import (
	"archive/tar"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cubesandbox/cubetemplatecenter/test/images"
)

// Image names Run knows.
const (
	// ImageDebian is the debootstrapped Debian bookworm minbase tree in
	// three layers: usr/, then etc/ and var/, then the rest.
	ImageDebian = "debian"
	// ImageLarge is ImageDebian plus a fourth layer of about 300 MiB of
	// mixed data: random, text, repetitive and mostly-zero files.
	ImageLarge = "large"
	// ImageSmall is one layer of 20,000 small text files.
	ImageSmall = "small"
	// ImageTiny is a two-layer image of a few dozen files with a
	// whiteout, an opaque directory, a hard link and a symlink: the smoke
	// test's image.
	ImageTiny = "tiny"
)

// DefaultImages returns the images `make bench` measures.
func DefaultImages() []string { return []string{ImageDebian, ImageLarge, ImageSmall} }

// genVersion changes whenever a generator's output changes, so that cached
// blobs are made again.
const genVersion = 2

// imageCreated is the creation time of every generated image.
var imageCreated = time.Date(2024, 6, 1, 12, 0, 0, 0, time.UTC)

// benchImage is a generated image: its layer blobs on disk.
type benchImage struct {
	Name    string       `json:"name"`
	Version int          `json:"version"`
	Layers  []*layerFile `json:"layers"`
}

// compressed is the sum of the blob sizes.
func (b *benchImage) compressed() int64 {
	var n int64
	for _, l := range b.Layers {
		n += l.Blob
	}
	return n
}

// uncompressed is the sum of the tar stream sizes.
func (b *benchImage) uncompressed() int64 {
	var n int64
	for _, l := range b.Layers {
		n += l.Tar
	}
	return n
}

// entries counts the tar entries of all layers.
func (b *benchImage) entries() int {
	n := 0
	for _, l := range b.Layers {
		n += l.Entries
	}
	return n
}

// v1Image assembles the OCI image: the layers, an Entrypoint and Cmd that
// print /etc/os-release, a fixed creation time.
func (b *benchImage) v1Image() (v1.Image, error) {
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	cf, err := base.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("assemble image: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: imageCreated}
	cf.Config = v1.Config{
		Entrypoint: []string{"/bin/sh", "-c"},
		Cmd:        []string{"cat /etc/os-release"},
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		WorkingDir: "/",
	}
	img, err := mutate.ConfigFile(base, cf)
	if err != nil {
		return nil, fmt.Errorf("assemble image: %w", err)
	}
	adds := make([]mutate.Addendum, len(b.Layers))
	for i, l := range b.Layers {
		mt, _ := l.v1Layer().MediaType()
		adds[i] = mutate.Addendum{Layer: l.v1Layer(), MediaType: mt,
			History: v1.History{Created: v1.Time{Time: imageCreated}, CreatedBy: fmt.Sprintf("tcbench %s layer %d", b.Name, i)}}
	}
	if img, err = mutate.Append(img, adds...); err != nil {
		return nil, fmt.Errorf("assemble image: %w", err)
	}
	return img, nil
}

// push writes the image to the registry as bench/<name>:1 and returns the
// reference.
func (b *benchImage) push(ctx context.Context, host string) (string, error) {
	img, err := b.v1Image()
	if err != nil {
		return "", err
	}
	ref := host + "/bench/" + b.Name + ":1"
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	if err := remote.Write(r, img, remote.WithContext(ctx), remote.WithJobs(4)); err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	return ref, nil
}

// prepareImage returns the named image's blobs under dir/<name>, made on
// first use and reused while genVersion and the blob files still match.
func prepareImage(ctx context.Context, imgName, dir string, log io.Writer) (*benchImage, error) {
	out := filepath.Join(dir, imgName)
	meta := filepath.Join(out, "image.json")
	if b, err := os.ReadFile(meta); err == nil {
		var img benchImage
		if json.Unmarshal(b, &img) == nil && img.Version == genVersion && len(img.Layers) > 0 {
			ok := true
			for _, l := range img.Layers {
				ok = ok && l.valid()
			}
			if ok {
				return &img, nil
			}
		}
	}
	if err := os.RemoveAll(out); err != nil {
		return nil, fmt.Errorf("prepare image %s: %w", imgName, err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, fmt.Errorf("prepare image %s: %w", imgName, err)
	}
	began := time.Now()
	img := &benchImage{Name: imgName, Version: genVersion}
	var err error
	switch imgName {
	case ImageDebian:
		var root string
		if root, err = images.EnsureDebianRootfs(ctx, log); err == nil {
			img.Layers, err = treeLayers(ctx, root, out)
		}
	case ImageLarge:
		var deb *benchImage
		if deb, err = prepareImage(ctx, ImageDebian, dir, log); err == nil {
			var data *layerFile
			data, err = writeLayer(filepath.Join(out, "data.tar.gz"), func(tw *countingTar) error {
				return mixedData(tw, "opt/bench-data", 300<<20, 1)
			})
			img.Layers = append(append(img.Layers, deb.Layers...), data)
		}
	case ImageSmall:
		var l *layerFile
		l, err = writeLayer(filepath.Join(out, "files.tar.gz"), func(tw *countingTar) error {
			return smallFiles(tw, 20000, 2)
		})
		img.Layers = []*layerFile{l}
	case ImageTiny:
		img.Layers, err = tinyLayers(out)
	default:
		return nil, fmt.Errorf("prepare image: unknown image %q (have %s, %s, %s, %s)", imgName, ImageDebian, ImageLarge, ImageSmall, ImageTiny)
	}
	if err != nil {
		return nil, fmt.Errorf("prepare image %s: %w", imgName, err)
	}
	if err := saveJSON(meta, img); err != nil {
		return nil, err
	}
	fmt.Fprintf(log, "generated image %s: %d layers, %.1f MiB compressed, %.1f MiB of tar, %d entries (%s)\n",
		imgName, len(img.Layers), mib(img.compressed()), mib(img.uncompressed()), img.entries(), time.Since(began).Round(time.Millisecond))
	return img, nil
}

// treeLayers packs the tree at root into images.TreeLayers gzip layers as
// images.TreeImage does (images.Tree), written to files under out.
func treeLayers(ctx context.Context, root, out string) ([]*layerFile, error) {
	tree, err := images.ScanTree(ctx, root)
	if err != nil {
		return nil, err
	}
	layers := make([]*layerFile, images.TreeLayers)
	errs := make([]error, images.TreeLayers)
	var wg sync.WaitGroup
	for i := range layers {
		wg.Go(func() {
			layers[i], errs[i] = writeLayer(filepath.Join(out, fmt.Sprintf("layer%d.tar.gz", i)), func(tw *countingTar) error {
				return tree.WriteLayer(tw, i)
			})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return layers, nil
}

// newRand returns a deterministic generator for seed.
func newRand(seed uint64) (*rand.Rand, *rand.ChaCha8) {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	copy(s[8:], "cube-templatecenter bench")
	c := rand.NewChaCha8(s)
	return rand.New(c), c
}

// Content kinds of mixedData, in rotation.
const (
	kindRandom = iota // incompressible
	kindText          // words and lines: gzip gets about 3x
	kindRepeat        // an 8 KiB record repeated with a few bytes changed: gzip gets >10x
	kindSparse        // three of four 4 KiB blocks zero, the fourth text
	kindCount
)

// mixedSizes are the file sizes mixedData cycles through.
var mixedSizes = [...]int64{16 << 10, 200 << 10, 1 << 20, 3 << 20, 12 << 20, 48 << 10, 600 << 10, 32 << 20, 5000, 7 << 20}

// mixedData writes files of the four content kinds under dir until total
// bytes of content are written, in directories of 16 files.
func mixedData(tw *countingTar, dir string, total int64, seed uint64) error {
	r, c := newRand(seed)
	words := vocabulary(r)
	mtime := imageCreated
	var parts []string
	for _, p := range strings.Split(dir, "/") {
		parts = append(parts, p)
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.Join(parts, "/") + "/", Mode: 0o755, ModTime: mtime}); err != nil {
			return err
		}
	}
	buf := make([]byte, 64<<10)
	var written int64
	for i := 0; written < total; i++ {
		sub := fmt.Sprintf("%s/%03d", dir, i/16)
		if i%16 == 0 {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: sub + "/", Mode: 0o755, ModTime: mtime}); err != nil {
				return err
			}
		}
		size := mixedSizes[i%len(mixedSizes)]
		kind := (i + i/len(mixedSizes)) % kindCount // every size gets every kind
		name := fmt.Sprintf("%s/f%05d.%s", sub, i, [...]string{"bin", "txt", "rec", "img"}[kind])
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, ModTime: mtime}); err != nil {
			return err
		}
		var record []byte
		if kind == kindRepeat {
			record = make([]byte, 8<<10)
			c.Read(record)
		}
		for left := size; left > 0; {
			n := min(left, int64(len(buf)))
			chunk := buf[:n]
			switch kind {
			case kindRandom:
				c.Read(chunk)
			case kindText:
				fillText(r, words, chunk)
			case kindRepeat:
				for off := 0; off < len(chunk); off += len(record) {
					k := copy(chunk[off:], record)
					for range 16 {
						chunk[off+r.IntN(k)] = byte(r.Uint32())
					}
				}
			case kindSparse:
				clear(chunk)
				for off := 0; off+4096 <= len(chunk); off += 16384 {
					fillText(r, words, chunk[off:off+4096])
				}
			}
			if _, err := tw.Write(chunk); err != nil {
				return err
			}
			left -= n
		}
		written += size
	}
	return nil
}

// smallFiles writes n small text files (64 B to 16 KiB, most under 2 KiB)
// in directories of 100, plus etc/os-release.
func smallFiles(tw *countingTar, n int, seed uint64) error {
	r, _ := newRand(seed)
	words := vocabulary(r)
	mtime := imageCreated
	for _, d := range []string{"./", "etc/", "srv/", "srv/files/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: mtime}); err != nil {
			return err
		}
	}
	osRelease := "PRETTY_NAME=\"tcbench small files\"\nID=tcbench\n"
	if err := writeFile(tw, "etc/os-release", 0o644, []byte(osRelease)); err != nil {
		return err
	}
	buf := make([]byte, 16<<10+64)
	for i := range n {
		if i%100 == 0 {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: fmt.Sprintf("srv/files/d%03d/", i/100), Mode: 0o755, ModTime: mtime}); err != nil {
				return err
			}
		}
		size := 64 + r.IntN(1<<uint(r.IntN(15)))
		content := buf[:size]
		fillText(r, words, content)
		if err := writeFile(tw, fmt.Sprintf("srv/files/d%03d/f%05d.txt", i/100, i), 0o644, content); err != nil {
			return err
		}
	}
	return nil
}

// tinyLayers writes the smoke test's two layers: a base with every common
// file kind, and an upper layer that deletes (whiteout), hides a directory's
// old content (opaque) and overwrites.
func tinyLayers(out string) ([]*layerFile, error) {
	r, c := newRand(3)
	words := vocabulary(r)
	text := func(n int) []byte {
		b := make([]byte, n)
		fillText(r, words, b)
		return b
	}
	random := func(n int) []byte {
		b := make([]byte, n)
		c.Read(b)
		return b
	}
	dir := func(tw *countingTar, name string) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: imageCreated})
	}
	base, err := writeLayer(filepath.Join(out, "base.tar.gz"), func(tw *countingTar) error {
		for _, d := range []string{"./", "bin/", "etc/", "etc/ssl/", "etc/ssl/certs/", "opt/", "opt/old/", "var/", "var/log/", "home/", "home/user/"} {
			if err := dir(tw, d); err != nil {
				return err
			}
		}
		files := []struct {
			name string
			mode int64
			body []byte
		}{
			{"bin/tool", 0o755, random(70000)},
			{"bin/su", 0o4755, random(3000)},
			{"etc/os-release", 0o644, []byte("PRETTY_NAME=\"tcbench tiny\"\nID=tcbench\n")},
			{"etc/motd", 0o644, text(300)},
			{"etc/ssl/certs/ca-certificates.crt", 0o644, []byte("# an empty bundle\n")},
			{"opt/old/a", 0o644, text(5000)},
			{"opt/old/b", 0o644, text(9000)},
			{"var/log/big.log", 0o640, text(300 << 10)},
		}
		for _, f := range files {
			if err := writeFile(tw, f.name, f.mode, f.body); err != nil {
				return err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "home/user/notes", Mode: 0o600, Uid: 1000, Gid: 1000,
			Size: 100, ModTime: imageCreated}); err != nil {
			return err
		}
		if _, err := tw.Write(text(100)); err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeLink, Name: "bin/tool-again", Linkname: "bin/tool", ModTime: imageCreated}); err != nil {
			return err
		}
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "sbin", Linkname: "bin", Mode: 0o777, ModTime: imageCreated})
	})
	if err != nil {
		return nil, err
	}
	upper, err := writeLayer(filepath.Join(out, "upper.tar.gz"), func(tw *countingTar) error {
		for _, d := range []string{"etc/", "opt/", "opt/old/", "usr/", "usr/share/"} {
			if err := dir(tw, d); err != nil {
				return err
			}
		}
		if err := writeFile(tw, "etc/.wh.motd", 0o644, nil); err != nil {
			return err
		}
		if err := writeFile(tw, "opt/old/.wh..wh..opq", 0o644, nil); err != nil {
			return err
		}
		if err := writeFile(tw, "opt/old/c", 0o644, text(2000)); err != nil {
			return err
		}
		if err := writeFile(tw, "etc/os-release", 0o644, []byte("PRETTY_NAME=\"tcbench tiny 2\"\nID=tcbench\nVERSION_ID=2\n")); err != nil {
			return err
		}
		sparse := make([]byte, 64<<10)
		copy(sparse[40<<10:], text(1000))
		return writeFile(tw, "usr/share/sparse.img", 0o644, sparse)
	})
	if err != nil {
		return nil, err
	}
	return []*layerFile{base, upper}, nil
}

func writeFile(tw *countingTar, name string, mode int64, body []byte) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body)), ModTime: imageCreated}); err != nil {
		return err
	}
	_, err := tw.Write(body)
	return err
}

// vocabulary makes 2048 pseudo-words of 2 to 11 letters.
func vocabulary(r *rand.Rand) [][]byte {
	words := make([][]byte, 2048)
	for i := range words {
		w := make([]byte, 2+r.IntN(10))
		for j := range w {
			w[j] = 'a' + byte(r.IntN(26))
		}
		words[i] = w
	}
	return words
}

// fillText fills b with lines of words, frequent words more often (a rough
// Zipf), which gzip compresses about threefold like real text.
func fillText(r *rand.Rand, words [][]byte, b []byte) {
	pos, col := 0, 0
	for pos < len(b) {
		w := words[r.IntN(r.IntN(len(words))+1)]
		pos += copy(b[pos:], w)
		col += len(w)
		if pos < len(b) {
			if col > 70 {
				b[pos], col = '\n', 0
			} else {
				b[pos] = ' '
				col++
			}
			pos++
		}
	}
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
