package startcheck

import (
	"fmt"
	"io/fs"
	"slices"
	"strconv"
)

// account is the user the start command runs as, as the runtime sets it
// from Spec.User: a uid, a primary gid and supplementary gids.
type account struct {
	// known is false when the user could not be resolved (the check
	// fails for that already): permissions are then not checked.
	known    bool
	uid, gid uint32
	groups   []uint32 // supplementary
}

// rootAccount is the user of an empty Spec.User.
var rootAccount = account{known: true}

// Permission bits an access asks for.
const (
	permRead fs.FileMode = 4
	permExec fs.FileMode = 1
)

// may reports whether a may access the entry e with the permission
// bits want, as the kernel decides from the mode (POSIX ACLs are not
// read): root may do anything to a directory and read any file, and
// execute a file with at least one execute bit; any other user gets the
// owner's bits when it owns the entry, else the group's when it is in
// the entry's group, else the others'.
func (a account) may(e Entry, want fs.FileMode) bool {
	if !a.known {
		return true
	}
	perm := e.Mode.Perm()
	if a.uid == 0 {
		return want&permExec == 0 || e.Mode.IsDir() || perm&0o111 != 0
	}
	var bits fs.FileMode
	switch {
	case e.UID == a.uid:
		bits = perm >> 6
	case a.inGroup(e.GID):
		bits = perm >> 3 & 7
	default:
		bits = perm & 7
	}
	return bits&want == want
}

func (a account) inGroup(gid uint32) bool {
	return gid == a.gid || slices.Contains(a.groups, gid)
}

// String names the account in messages.
func (a account) String() string {
	if len(a.groups) == 0 {
		return fmt.Sprintf("uid %d (gid %d)", a.uid, a.gid)
	}
	return fmt.Sprintf("uid %d (gid %d, groups %v)", a.uid, a.gid, a.groups)
}

// owner describes e's owner and mode for a message.
func owner(e Entry) string {
	return fmt.Sprintf("mode %04o, owner %d:%d", e.Mode.Perm(), e.UID, e.GID)
}

// deniedTo describes why a may not access e with want, for a message.
func (a account) deniedTo(e Entry, want fs.FileMode) string {
	verb := "readable"
	if want == permExec {
		verb = "executable"
		if e.Mode.IsDir() {
			verb = "searchable"
		}
	}
	return fmt.Sprintf("not %s by %s (%s)", verb, a, owner(e))
}

// passwdEntry is what the check uses of a line of /etc/passwd (id is the
// uid) or of /etc/group (id is the gid).
type passwdEntry struct {
	name    string
	id, gid uint32
}

// parseID parses a uid or gid as the runtime does: a decimal number that
// fits 32 bits.
func parseID(s string) (uint32, bool) {
	if !numeric(s) {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 32)
	return uint32(n), err == nil
}
