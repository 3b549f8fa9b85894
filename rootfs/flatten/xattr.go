package flatten

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"sort"
	"strings"

	"github.com/cubesandbox/cubetemplatecenter/rootfs/ext4"
)

// PAX record prefixes that carry extended attributes: GNU tar and Go write
// SCHILY.xattr.<name> with the raw value; bsdtar also writes
// LIBARCHIVE.xattr.<url-encoded name> with a base64 value.
const (
	paxSchilyXattr     = "SCHILY.xattr."
	paxLibarchiveXattr = "LIBARCHIVE.xattr."
)

// droppedXattr is never copied into the image: labels come from the guest's
// policy, not from the build host.
const droppedXattr = "security.selinux"

// xattrNamespaces are the namespaces Linux accepts; other names could not
// be set by a real unpack either.
var xattrNamespaces = []string{"user.", "trusted.", "security.", "system."}

// paxXattrs returns the extended attributes recorded in PAX records, sorted
// by name. A SCHILY record wins over a LIBARCHIVE one of the same name.
func paxXattrs(records map[string]string) ([]ext4.Xattr, error) {
	if len(records) == 0 {
		return nil, nil
	}
	found := make(map[string][]byte)
	for k, v := range records {
		name, ok := strings.CutPrefix(k, paxLibarchiveXattr)
		if !ok {
			continue
		}
		n, err := url.PathUnescape(name)
		if err != nil {
			return nil, fmt.Errorf("xattr record %q: bad name encoding", k)
		}
		val, err := decodeBase64(v)
		if err != nil {
			return nil, fmt.Errorf("xattr record %q: bad base64 value", k)
		}
		found[n] = val
	}
	for k, v := range records {
		if name, ok := strings.CutPrefix(k, paxSchilyXattr); ok {
			found[name] = []byte(v)
		}
	}
	var xs []ext4.Xattr
	for name, val := range found {
		if name == droppedXattr || !knownNamespace(name) {
			continue
		}
		xs = append(xs, ext4.Xattr{Name: name, Value: val})
	}
	sort.Slice(xs, func(i, j int) bool { return xs[i].Name < xs[j].Name })
	return xs, nil
}

func knownNamespace(name string) bool {
	for _, ns := range xattrNamespaces {
		if strings.HasPrefix(name, ns) && len(name) > len(ns) {
			return true
		}
	}
	return false
}

// decodeBase64 accepts padded and unpadded standard base64.
func decodeBase64(s string) ([]byte, error) {
	if b, err := base64.StdEncoding.DecodeString(s); err == nil {
		return b, nil
	}
	return base64.RawStdEncoding.DecodeString(s)
}
