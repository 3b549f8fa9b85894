package startcheck

import (
	"io/fs"
	"strings"
	"testing"
)

// TestPermissions checks the start command as users other than root:
// execute bits by owner, group (primary and supplementary) and others,
// directories it must search, scripts its interpreter must read, and
// libraries the loader must read.
func TestPermissions(t *testing.T) {
	setup := func(m *memFS) {
		own := func(p string, uid, gid uint32) {
			e := m.entries[p]
			e.UID, e.GID = uid, gid
			m.entries[p] = e
		}
		m.prog("/srv/owner", 0o700, dynOpts{needed: []string{"libc.so.6"}})
		own("/srv/owner", 1000, 1000)
		m.prog("/srv/group", 0o750, dynOpts{needed: []string{"libc.so.6"}})
		own("/srv/group", 0, 1000)
		m.prog("/srv/shared", 0o750, dynOpts{needed: []string{"libc.so.6"}})
		own("/srv/shared", 0, 2000)
		m.prog("/srv/noowner", 0o075, dynOpts{needed: []string{"libc.so.6"}})
		own("/srv/noowner", 1000, 1000)
		m.prog("/srv/rootonly", 0o100, dynOpts{needed: []string{"libc.so.6"}})
		m.prog("/private/app", 0o755, dynOpts{needed: []string{"libc.so.6"}})
		m.entries["/private"] = Entry{Mode: fs.ModeDir | 0o700}
		m.file("/srv/script", 0o711, []byte("#!/bin/sh\necho\n"))
		m.prog("/usr/bin/dash", 0o755, dynOpts{needed: []string{"libc.so.6"}}).link("/usr/bin/sh", "dash")
		m.prog("/srv/secret", 0o755, dynOpts{needed: []string{"libsecret.so"}})
		m.lib("/usr/lib/x86_64-linux-gnu/libsecret.so", dynOpts{})
		e := m.entries["/usr/lib/x86_64-linux-gnu/libsecret.so"]
		e.Mode = 0o600
		m.entries["/usr/lib/x86_64-linux-gnu/libsecret.so"] = e
	}
	tests := []struct {
		cmd, user string
		want      want
	}{
		{"/srv/owner", "app", want{result: ResultOK}},
		{"/srv/owner", "web", want{result: ResultFailed, first: []string{`"/srv/owner" is not executable by uid 33 (gid 33, groups [2000]) (mode 0700, owner 1000:1000)`}}},
		{"/srv/group", "app", want{result: ResultOK}},
		{"/srv/group", "1000", want{result: ResultOK}},
		{"/srv/group", "1000:33", want{result: ResultFailed, first: []string{"not executable by uid 1000 (gid 33"}}},
		{"/srv/shared", "web", want{result: ResultOK}},
		{"/srv/shared", "4242", want{result: ResultFailed, first: []string{"not executable by uid 4242 (gid 0)"}}},
		// The owner's bits decide for the owner, whatever the others'.
		{"/srv/noowner", "app", want{result: ResultFailed, first: []string{"not executable by uid 1000"}}},
		{"/srv/noowner", "web", want{result: ResultOK}},
		{"/srv/rootonly", "", want{result: ResultOK}},
		{"/srv/rootonly", "root", want{result: ResultOK}},
		{"/private/app", "app", want{result: ResultFailed, first: []string{`"/private/app" is in directory "/private", not searchable by uid 1000`}}},
		{"/srv/script", "app", want{result: ResultFailed, first: []string{`"/srv/script" is not readable by uid 1000`, "its interpreter cannot read it"}}},
		{"/srv/script", "root", want{result: ResultOK}},
		{"/srv/secret", "root", want{result: ResultOK}},
		{"/srv/secret", "app", want{result: ResultFailed, first: []string{`library "libsecret.so" needed by "/srv/secret" not found`, `passed over: "/lib/x86_64-linux-gnu/libsecret.so" not readable by uid 1000`}}},
	}
	for _, tt := range tests {
		t.Run(strings.TrimPrefix(tt.cmd, "/")+"As"+tt.user, func(t *testing.T) {
			m := glibcTree()
			setup(m)
			r := Check(m, Spec{Argv: []string{tt.cmd}, User: tt.user, Arch: "amd64"})
			t.Logf("Check = %s", mustJSON(t, r))
			expect(t, r, tt.want)
		})
	}
	t.Run("PathSkipsWhatTheUserCannotRun", func(t *testing.T) {
		m := glibcTree()
		m.prog("/usr/local/bin/tool", 0o700, dynOpts{needed: []string{"libc.so.6"}})
		m.prog("/usr/bin/tool", 0o755, dynOpts{needed: []string{"libc.so.6"}})
		r := Check(m, Spec{Argv: []string{"tool"}, User: "app", Arch: "amd64"})
		expect(t, r, want{result: ResultOK, command0: "/usr/bin/tool"})
	})
}
