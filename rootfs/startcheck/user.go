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
	resolved, e, rerr := c.resolve(file)
	if rerr != nil {
		if rerr.kind == errNotExist {
			c.fail("%s %q: %s not found in the image", kind, name, file)
		} else {
			c.fail("%s %q: %v", kind, name, rerr)
		}
		return
	}
	if !e.Mode.IsRegular() {
		c.fail("%s %q: %s is %s", kind, name, file, describe(e))
		return
	}
	data, err := c.fs.ReadHead(resolved, maxAccountFile)
	if err != nil {
		c.warn("%s %q: read %s: %v", kind, name, file, err)
		return
	}
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		if f, _, ok := bytes.Cut(line, []byte(":")); ok && string(f) == name {
			return
		}
	}
	if len(data) >= maxAccountFile {
		c.warn("%s %q not found in the first %d bytes of %s", kind, name, maxAccountFile, file)
		return
	}
	c.fail("%s %q not found in %s", kind, name, file)
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
		c.fail("envd: %v", rerr)
		return
	}
	lbl := "envd " + label(p, resolved)
	if !e.Mode.IsRegular() || e.Mode.Perm()&0o111 == 0 {
		c.fail("%s is %s", lbl, describe(e))
		return
	}
	head, err := c.fs.ReadHead(resolved, headSize)
	if err != nil {
		c.warn("%s: read header: %v", lbl, err)
		return
	}
	if !isELF(head) {
		c.fail("%s is not an ELF file", lbl)
		return
	}
	c.checkELF(lbl, resolved, head)
}
