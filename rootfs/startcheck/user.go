package startcheck

import (
	"bytes"
	"strings"
)

// maxAccountFile bounds what the check reads of /etc/passwd and
// /etc/group: far more than any image holds, little enough to stay cheap.
const maxAccountFile = 1 << 20

// checkUser checks that a user (and group) given by name exists in the
// image, as the runtime looks it up; numeric ids need no entry.
func (c *checker) checkUser() {
	u := c.spec.User
	if u == "" {
		return
	}
	name, group, hasGroup := strings.Cut(u, ":")
	if name != "" && !numeric(name) {
		c.checkAccount("user", name, "/etc/passwd")
	}
	if hasGroup && group != "" && !numeric(group) {
		c.checkAccount("group", group, "/etc/group")
	}
}

func numeric(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

// checkAccount looks name up in the first field of the colon-separated
// file at file.
func (c *checker) checkAccount(kind, name, file string) {
	who := kind + " " + quote(name)
	resolved, e, rerr := c.resolve(file)
	switch {
	case rerr == nil:
	case rerr.kind == errLimit:
		return
	case rerr.kind == errNotExist:
		c.fail("%s: %s not found in the image", who, file)
		return
	default:
		c.fail("%s: %v", who, rerr)
		return
	}
	if !e.Mode.IsRegular() {
		c.fail("%s: %s is %s", who, file, describe(e))
		return
	}
	data, err := c.fs.ReadHead(resolved, maxAccountFile)
	if err != nil {
		c.warn("%s: read %s: %s", who, file, errText(err))
		return
	}
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		if f, _, ok := bytes.Cut(line, []byte(":")); ok && string(f) == name {
			return
		}
	}
	if len(data) >= maxAccountFile {
		c.warn("%s not found in the first %d bytes of %s", who, maxAccountFile, file)
		return
	}
	c.fail("%s not found in %s", who, file)
}

// checkEnvd checks the injected envd: an ELF of the image's architecture
// whose loader, if any, exists in the image.
func (c *checker) checkEnvd() {
	if c.spec.Envd == "" {
		return
	}
	p := cleanAbs("/", c.spec.Envd)
	resolved, e, rerr := c.resolve(p)
	if rerr != nil {
		if rerr.kind != errLimit {
			c.fail("envd: %v", rerr)
		}
		return
	}
	lbl := "envd " + label(p, resolved)
	if !e.Mode.IsRegular() || e.Mode.Perm()&0o111 == 0 {
		c.fail("%s is %s", lbl, describe(e))
		return
	}
	head, err := c.fs.ReadHead(resolved, headSize)
	if err != nil {
		c.warn("%s: read header: %s", lbl, errText(err))
		return
	}
	if !isELF(head) {
		c.fail("%s is not an ELF file", lbl)
		return
	}
	c.checkELF(lbl, resolved, head)
}
