package oci

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// RefKind says where an image reference points.
type RefKind int

// The kinds of image source ValidateImageRef accepts.
const (
	// KindRegistry is an image in a registry, e.g. docker.io/library/debian:12.
	KindRegistry RefKind = iota
	// KindOCILayout is an OCI image layout directory: oci-layout:PATH[:TAG|@DIGEST].
	KindOCILayout
	// KindDockerArchive is a `docker save` tarball: docker-archive:PATH.
	KindDockerArchive
)

// String returns the prefix that selects the kind in a reference.
func (k RefKind) String() string {
	switch k {
	case KindRegistry:
		return "docker"
	case KindOCILayout:
		return "oci-layout"
	case KindDockerArchive:
		return "docker-archive"
	}
	return fmt.Sprintf("RefKind(%d)", int(k))
}

// Prefixes of the offline (air-gapped) reference forms.
const (
	ociLayoutPrefix     = "oci-layout:"
	dockerArchivePrefix = "docker-archive:"
)

// refChars is upstream's allowed character set for an image reference (after
// the optional scheme prefix is removed).
var refChars = regexp.MustCompile(`^[A-Za-z0-9._:/@-]+$`)

// layoutTag is the shape of a tag selecting an image in an OCI layout; it is
// the registry tag grammar.
var layoutTag = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)

// ParsedRef is a validated image reference.
type ParsedRef struct {
	// Kind says which of the fields below are set.
	Kind RefKind
	// Reference is the registry reference (KindRegistry only).
	Reference name.Reference
	// PlainHTTP is true when the reference was written http://..., selecting
	// a registry spoken to over plain HTTP (KindRegistry only).
	PlainHTTP bool
	// Path is the absolute, clean path of the layout directory or tarball
	// (offline kinds only).
	Path string
	// Tag selects an image of an OCI layout by its
	// org.opencontainers.image.ref.name annotation (KindOCILayout only).
	Tag string
	// Digest selects an image of an OCI layout by manifest digest
	// (KindOCILayout only).
	Digest string
}

// String returns the reference in a canonical form that ValidateImageRef
// accepts again.
func (r ParsedRef) String() string {
	switch r.Kind {
	case KindOCILayout:
		s := ociLayoutPrefix + r.Path
		if r.Digest != "" {
			return s + "@" + r.Digest
		}
		if r.Tag != "" {
			return s + ":" + r.Tag
		}
		return s
	case KindDockerArchive:
		return dockerArchivePrefix + r.Path
	}
	if r.Reference == nil {
		return ""
	}
	if r.PlainHTTP {
		return "http://" + r.Reference.Name()
	}
	return r.Reference.Name()
}

// sourceName is the part of the Image.Digest string before '@': the
// repository for registry references (index.docker.io shown as docker.io, as
// skopeo does) and the reference without tag or digest for offline ones.
func (r ParsedRef) sourceName() string {
	switch r.Kind {
	case KindOCILayout:
		return ociLayoutPrefix + r.Path
	case KindDockerArchive:
		return dockerArchivePrefix + r.Path
	}
	return displayRepo(r.Reference.Context())
}

// displayRepo names a repository the way upstream's digest strings do.
func displayRepo(repo name.Repository) string {
	n := repo.Name()
	if rest, ok := strings.CutPrefix(n, name.DefaultRegistry+"/"); ok {
		return "docker.io/" + rest
	}
	return n
}

// ValidateImageRef checks an image reference the way upstream does and parses
// it. Registry references may start with the transport docker://, then
// with the scheme https:// or http:// (http:// selects a plain-HTTP
// registry, for this reference only), each at most once, in that order:
// docker://http://host/repo:tag is valid, docker://docker://... and
// http://docker://... are not. The rest must match ^[A-Za-z0-9._:/@-]+$,
// must not start with '-', must have no empty path component ("a//b",
// "/a", "a/") and must parse with name.ParseReference. The offline forms
// oci-layout:PATH[:TAG|@DIGEST] and docker-archive:PATH take an absolute,
// clean PATH in the same character set.
func ValidateImageRef(ref string) (ParsedRef, error) {
	if ref == "" {
		return ParsedRef{}, fmt.Errorf("%w: empty reference", ErrInvalidRef)
	}
	if rest, ok := strings.CutPrefix(ref, ociLayoutPrefix); ok {
		return parseLayoutRef(ref, rest)
	}
	if rest, ok := strings.CutPrefix(ref, dockerArchivePrefix); ok {
		return parseArchiveRef(ref, rest)
	}
	// Upstream strips the transport, then the scheme.
	rest, plainHTTP := strings.TrimPrefix(ref, "docker://"), false
	if r, ok := strings.CutPrefix(rest, "https://"); ok {
		rest = r
	} else if r, ok := strings.CutPrefix(rest, "http://"); ok {
		rest, plainHTTP = r, true
	}
	if err := checkChars(ref, rest); err != nil {
		return ParsedRef{}, err
	}
	if strings.Contains(rest, "//") {
		return ParsedRef{}, fmt.Errorf("%w %q: empty path component", ErrInvalidRef, ref)
	}
	var opts []name.Option
	if plainHTTP {
		opts = append(opts, name.Insecure)
	}
	parsed, err := name.ParseReference(rest, opts...)
	if err != nil {
		return ParsedRef{}, fmt.Errorf("%w %q: %v", ErrInvalidRef, ref, err)
	}
	// name.ParseReference takes a leading or trailing '/' ("/x", "x/",
	// "x/:tag") as an empty repository component, giving a name that no
	// registry serves and that does not parse again.
	if slices.Contains(strings.Split(parsed.Context().RepositoryStr(), "/"), "") {
		return ParsedRef{}, fmt.Errorf("%w %q: empty path component", ErrInvalidRef, ref)
	}
	return ParsedRef{Kind: KindRegistry, Reference: parsed, PlainHTTP: plainHTTP}, nil
}

func checkChars(ref, rest string) error {
	if rest == "" {
		return fmt.Errorf("%w %q: nothing after the prefix", ErrInvalidRef, ref)
	}
	if strings.HasPrefix(rest, "-") {
		return fmt.Errorf("%w %q: must not start with '-'", ErrInvalidRef, ref)
	}
	if !refChars.MatchString(rest) {
		return fmt.Errorf("%w %q: only letters, digits and . _ : / @ - are allowed", ErrInvalidRef, ref)
	}
	return nil
}

func checkPath(ref, path string) error {
	if err := checkChars(ref, path); err != nil {
		return err
	}
	if !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return fmt.Errorf("%w %q: the path must be absolute and clean (no '..', '//' or trailing '/')", ErrInvalidRef, ref)
	}
	return nil
}

// parseLayoutRef parses the part after "oci-layout:". A '@' starts a digest;
// otherwise a ':' after the last '/' starts a tag, so a layout directory whose
// last path element contains ':' cannot be named.
func parseLayoutRef(ref, rest string) (ParsedRef, error) {
	out := ParsedRef{Kind: KindOCILayout, Path: rest}
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		out.Path, out.Digest = rest[:i], rest[i+1:]
		if _, err := v1.NewHash(out.Digest); err != nil {
			return ParsedRef{}, fmt.Errorf("%w %q: bad digest: %v", ErrInvalidRef, ref, err)
		}
	} else if i := strings.LastIndex(rest, ":"); i > strings.LastIndex(rest, "/") {
		out.Path, out.Tag = rest[:i], rest[i+1:]
		if !layoutTag.MatchString(out.Tag) {
			return ParsedRef{}, fmt.Errorf("%w %q: bad tag %q", ErrInvalidRef, ref, out.Tag)
		}
	}
	if err := checkPath(ref, out.Path); err != nil {
		return ParsedRef{}, err
	}
	return out, nil
}

// parseArchiveRef parses the part after "docker-archive:". Unlike skopeo no
// image selector is accepted: the tarball must hold exactly one image.
func parseArchiveRef(ref, rest string) (ParsedRef, error) {
	if strings.ContainsAny(rest, ":@") {
		return ParsedRef{}, fmt.Errorf("%w %q: docker-archive takes a path only (no tag or digest)", ErrInvalidRef, ref)
	}
	if err := checkPath(ref, rest); err != nil {
		return ParsedRef{}, err
	}
	return ParsedRef{Kind: KindDockerArchive, Path: rest}, nil
}
