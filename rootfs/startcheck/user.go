package startcheck

import (
	"bytes"
	"slices"
	"strings"
)

// maxAccountFile bounds what the check reads of /etc/passwd and
// /etc/group: far more than any image holds, little enough to stay cheap.
const maxAccountFile = 1 << 20

// checkUser resolves the user (and group) the runtime runs the start
// command as, and checks that the names it gives exist in the image; the
// command's checks then use its uid and gids. As runc and containerd do:
// a user given by name is looked up in /etc/passwd, which gives its uid
// and primary gid; a numeric uid needs no entry (its gid is then 0) but
// takes the gid of the entry it has; an explicit group (name or gid)
// replaces the primary gid; the supplementary groups are those of
// /etc/group that list the user's name. An empty User is root.
func (c *checker) checkUser() account {
	u := c.spec.User
	if u == "" {
		return rootAccount
	}
	name, group, hasGroup := strings.Cut(u, ":")
	acct := account{known: true}
	username := ""
	switch uid, isID := parseID(name); {
	case name == "":
	case isID:
		acct.uid = uid
		// The entry of the uid, if any, gives the primary gid and the
		// name supplementary groups are listed under.
		if e, ok := c.findAccount("", name, "/etc/passwd", true); ok {
			acct.gid, username = e.gid, e.name
		}
	case numeric(name):
		// A number beyond 32 bits: the runtime refuses it.
		c.fail("user %s: not a valid uid", quote(name))
		acct.known = false
	default:
		e, ok := c.findAccount("user", name, "/etc/passwd", false)
		if !ok {
			acct.known = false
			break
		}
		acct.uid, acct.gid, username = e.id, e.gid, e.name
	}
	if hasGroup && group != "" {
		if gid, isID := parseID(group); isID {
			acct.gid = gid
		} else if e, ok := c.findAccount("group", group, "/etc/group", false); ok {
			acct.gid = e.id
		} else {
			acct.known = false
		}
	}
	if acct.known && username != "" {
		acct.groups = c.memberOf(username)
	}
	return acct
}

func numeric(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

// readAccounts reads /etc/passwd or /etc/group (file), once per check,
// recording why it cannot as a problem of who, unless quiet; ok is false
// when there is nothing to look in.
func (c *checker) readAccounts(who, file string, quiet bool) (data []byte, ok bool) {
	if data, ok := c.accountFiles[file]; ok {
		return data, true
	}
	resolved, e, rerr := c.resolve(file)
	switch {
	case rerr == nil:
	case rerr.kind == errLimit || quiet:
		return nil, false
	case rerr.kind == errNotExist:
		c.fail("%s: %s not found in the image", who, file)
		return nil, false
	default:
		c.fail("%s: %v", who, rerr)
		return nil, false
	}
	if !e.Mode.IsRegular() {
		if !quiet {
			c.fail("%s: %s is %s", who, file, describe(e))
		}
		return nil, false
	}
	data, err := c.fs.ReadHead(resolved, maxAccountFile)
	if err != nil {
		if !quiet {
			c.warn("%s: read %s: %s", who, file, errText(err))
		}
		return nil, false
	}
	if c.accountFiles == nil {
		c.accountFiles = make(map[string][]byte, 2)
	}
	c.accountFiles[file] = data
	return data, true
}

// findAccount looks up the entry named name (by its first field), or
// with byID the entry whose id (third field) is the number name, in the
// colon-separated file at file; the first match wins. Ids read as runc
// reads them: a missing or invalid one is 0. A name not found is a
// problem of kind (user, group) unless byID.
func (c *checker) findAccount(kind, name, file string, byID bool) (passwdEntry, bool) {
	who := kind + " " + quote(name)
	data, ok := c.readAccounts(who, file, byID)
	if !ok {
		return passwdEntry{}, false
	}
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		f := strings.SplitN(string(line), ":", 5)
		if len(f) < 2 {
			continue
		}
		f = append(f, "", "")
		if (byID && f[2] != name) || (!byID && f[0] != name) {
			continue
		}
		id, _ := parseID(f[2])
		gid, _ := parseID(f[3])
		return passwdEntry{name: f[0], id: id, gid: gid}, true
	}
	switch {
	case byID:
	case len(data) >= maxAccountFile:
		c.warn("%s not found in the first %d bytes of %s", who, maxAccountFile, file)
	default:
		c.fail("%s not found in %s", who, file)
	}
	return passwdEntry{}, false
}

// memberOf returns the gids of the groups of /etc/group that list user
// among their members.
func (c *checker) memberOf(user string) []uint32 {
	data, ok := c.readAccounts("", "/etc/group", true)
	if !ok {
		return nil
	}
	var gids []uint32
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		f := strings.Split(string(line), ":")
		if len(f) < 4 || f[3] == "" {
			continue
		}
		gid, _ := parseID(f[2])
		if slices.Contains(strings.Split(f[3], ","), user) && !slices.Contains(gids, gid) {
			gids = append(gids, gid)
		}
	}
	return gids
}

// checkEnvd checks the injected envd: an ELF of the image's architecture
// whose loader, if any, exists in the image, with its libraries. The
// sandbox runs it as root.
func (c *checker) checkEnvd() {
	if c.spec.Envd == "" {
		return
	}
	acct := c.acct
	c.acct = rootAccount
	defer func() { c.acct = acct }()
	p := cleanAbs("/", c.spec.Envd)
	t, rerr := c.lookup(p)
	if rerr != nil {
		if rerr.kind != errLimit {
			c.fail("envd: %v", rerr)
		}
		return
	}
	lbl := "envd " + label(p, t.resolved)
	if why := c.notExecutable(t); why != "" {
		c.fail("%s is %s", lbl, why)
		return
	}
	head, err := c.fs.ReadHead(t.resolved, headSize)
	if err != nil {
		c.warn("%s: read header: %s", lbl, errText(err))
		return
	}
	if !isELF(head) {
		c.fail("%s is not an ELF file", lbl)
		return
	}
	c.checkELF(lbl, t.resolved, head)
}
