package inject

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"
	"github.com/cubesandbox/cubetemplatecenter/rootfs/flatten"
)

// DefaultCAPath is where upstream reads the CubeEgress root CA from.
const DefaultCAPath = "/etc/cube/ca/cube-root-ca.crt"

// AnchorName is the file name the CA gets in each anchor directory.
const AnchorName = "cube-egress-root.crt"

// SeedBundle is the bundle created when the image trusts nothing yet.
const SeedBundle = "etc/ssl/certs/ca-certificates.crt"

// bundles are the CA bundle files the CA is appended to, where they exist.
var bundles = [...]string{
	"etc/ssl/certs/ca-certificates.crt",
	"etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
	"etc/pki/tls/certs/ca-bundle.crt",
}

// anchorDirs are the trust-anchor directories that get AnchorName, where
// they exist.
var anchorDirs = [...]string{
	"usr/local/share/ca-certificates",
	"etc/pki/ca-trust/source/anchors",
	"etc/ca-certificates/trust-source",
	"system/etc/security/cacerts",
}

// CA is the CubeEgress root certificate.
type CA struct {
	// PEM is the canonical encoding: one CERTIFICATE block, 64-column
	// base64, ending in a newline.
	PEM []byte
	// DER is the certificate itself.
	DER []byte
	// Fingerprint is hex(sha256(DER)).
	Fingerprint string
}

// ParseCA accepts exactly one PEM CERTIFICATE block that parses as an X.509
// certificate; text around the block is ignored, any other block is an
// error.
func ParseCA(pemBytes []byte) (*CA, error) {
	var der []byte
	blocks := 0
	for rest := pemBytes; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		blocks++
		if b.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("parse CA: PEM block of type %q, want CERTIFICATE", b.Type)
		}
		der = b.Bytes
	}
	switch {
	case blocks == 0:
		return nil, errors.New("parse CA: no PEM CERTIFICATE block")
	case blocks > 1:
		return nil, fmt.Errorf("parse CA: %d certificates, want exactly one", blocks)
	}
	if _, err := x509.ParseCertificate(der); err != nil {
		return nil, fmt.Errorf("parse CA: %w", err)
	}
	sum := sha256.Sum256(der)
	return &CA{
		PEM:         pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		DER:         der,
		Fingerprint: hex.EncodeToString(sum[:]),
	}, nil
}

// LoadCA reads and parses the CA at path (see ParseCA).
func LoadCA(path string) (*CA, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load CA: %w", err)
	}
	ca, err := ParseCA(b)
	if err != nil {
		return nil, fmt.Errorf("load CA %s: %w", path, err)
	}
	return ca, nil
}

// CAResult reports what BakeCA did.
type CAResult struct {
	// Baked is true when the image trusts the CA afterwards: something was
	// written, or the CA was already present.
	Baked bool
	// TargetsWritten counts the bundles appended to, anchors written and
	// the seed bundle.
	TargetsWritten int
	Fingerprint    string
	// Seeded is true when SeedBundle was created with only this CA.
	Seeded bool
	// Skipped says why targets that exist were left alone.
	Skipped []string
}

// BakeCA makes the image trust ca, following upstream's rules: the
// canonical PEM is appended (after a newline if needed) to each CA bundle
// that exists (etc/ssl/certs/ca-certificates.crt,
// etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem,
// etc/pki/tls/certs/ca-bundle.crt) and does not hold the same certificate
// yet, keeping its mode and owner; AnchorName (0644 root:root) goes into
// each trust-anchor directory that exists (usr/local/share/ca-certificates,
// etc/pki/ca-trust/source/anchors, etc/ca-certificates/trust-source,
// system/etc/security/cacerts) unless it already holds the CA; and if nothing was written and the CA was found nowhere,
// SeedBundle is created with this CA alone. Symlinked bundles and anchor
// directories are followed inside the image only. Unlike upstream, a CA
// already present everywhere counts as baked.
func BakeCA(ctx context.Context, t *flatten.Tree, ca *CA, mtime time.Time) (CAResult, error) {
	res := CAResult{Fingerprint: ca.Fingerprint}
	found := false
	for _, b := range bundles {
		n, real, err := t.Resolve(b)
		if err != nil {
			if reason := resolveSkip(t, b, err); reason != "" {
				res.Skipped = append(res.Skipped, reason)
			}
			continue
		}
		if n.Mode&ext4.ModeTypeMask != ext4.ModeRegular {
			res.Skipped = append(res.Skipped, fmt.Sprintf("%s: not a regular file", b))
			continue
		}
		old, err := t.ReadFile(real)
		if err != nil {
			return res, fmt.Errorf("bake CA: %w", err)
		}
		if containsCert(old, ca.DER) {
			found = true
			continue
		}
		content := make([]byte, 0, len(old)+1+len(ca.PEM))
		content = append(content, old...)
		if len(content) > 0 && content[len(content)-1] != '\n' {
			content = append(content, '\n')
		}
		content = append(content, ca.PEM...)
		attr := flatten.FileAttr{Mode: n.Mode & 0o7777, UID: n.UID, GID: n.GID, Mtime: mtime, Xattrs: n.Xattrs()}
		if err := t.WriteFile(ctx, real, bytes.NewReader(content), int64(len(content)), attr); err != nil {
			return res, fmt.Errorf("bake CA: %s: %w", b, err)
		}
		res.TargetsWritten++
	}
	for _, d := range anchorDirs {
		n, real, err := t.Resolve(d)
		if err != nil {
			if reason := resolveSkip(t, d, err); reason != "" {
				res.Skipped = append(res.Skipped, reason)
			}
			continue
		}
		if n.Mode&ext4.ModeTypeMask != ext4.ModeDir {
			res.Skipped = append(res.Skipped, fmt.Sprintf("%s: not a directory", d))
			continue
		}
		target := real + "/" + AnchorName
		if old, err := t.Lookup(target); err == nil && old.Mode&ext4.ModeTypeMask == ext4.ModeRegular {
			content, err := t.ReadFile(target)
			if err != nil {
				return res, fmt.Errorf("bake CA: %w", err)
			}
			if containsCert(content, ca.DER) {
				found = true
				continue
			}
		} else if err == nil && old.Mode&ext4.ModeTypeMask == ext4.ModeDir {
			res.Skipped = append(res.Skipped, fmt.Sprintf("%s/%s: is a directory", d, AnchorName))
			continue
		}
		attr := flatten.FileAttr{Mode: 0o644, Mtime: mtime}
		if err := t.WriteFile(ctx, target, bytes.NewReader(ca.PEM), int64(len(ca.PEM)), attr); err != nil {
			return res, fmt.Errorf("bake CA: %s: %w", target, err)
		}
		res.TargetsWritten++
	}
	if res.TargetsWritten == 0 && !found {
		attr := flatten.FileAttr{Mode: 0o644, Mtime: mtime}
		err := t.WriteFile(ctx, SeedBundle, bytes.NewReader(ca.PEM), int64(len(ca.PEM)), attr)
		switch {
		case err == nil:
			res.Seeded = true
			res.TargetsWritten++
		case errors.Is(err, fs.ErrNotExist), errors.Is(err, flatten.ErrNotDir),
			errors.Is(err, flatten.ErrIsDir), errors.Is(err, flatten.ErrLoop):
			res.Skipped = append(res.Skipped, fmt.Sprintf("seed %s: %v", SeedBundle, err))
		default:
			return res, fmt.Errorf("bake CA: seed: %w", err)
		}
	}
	res.Baked = res.TargetsWritten > 0 || found
	return res, nil
}

// resolveSkip turns a failed resolution of p into a skip reason, or ""
// when p simply does not exist (nothing to do there).
func resolveSkip(t *flatten.Tree, p string, err error) string {
	if errors.Is(err, fs.ErrNotExist) {
		if n, lerr := t.Lookup(p); lerr == nil && n.Mode&ext4.ModeTypeMask == ext4.ModeSymlink {
			return fmt.Sprintf("%s: symlink resolves nowhere in the image", p)
		}
		return ""
	}
	return fmt.Sprintf("%s: %v", p, err)
}

// containsCert reports whether a PEM bundle holds a certificate with this
// DER encoding.
func containsCert(bundle, der []byte) bool {
	for rest := bundle; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return false
		}
		if b.Type == "CERTIFICATE" && bytes.Equal(b.Bytes, der) {
			return true
		}
	}
}
