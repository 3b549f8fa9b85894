package startcheck

import (
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// want is what a check case expects: the result, and substrings of the
// first problem (the message a failed build reports) or of any problem.
type want struct {
	result      string
	command0    string
	resolved    string
	interpreter string
	first       []string // substrings of Problems[0]
	problems    int      // len(Problems); 0: compared only for ok and no_command
}

func expect(t *testing.T, r Result, w want) {
	t.Helper()
	if r.Result != w.result {
		t.Errorf("Check: Result = %q, want %q (problems %q)", r.Result, w.result, r.Problems)
	}
	if r.Failed() != (w.result == ResultFailed) {
		t.Errorf("Check: Failed() = %v for Result %q", r.Failed(), r.Result)
	}
	if w.command0 != "" && (len(r.Command) == 0 || r.Command[0] != w.command0) {
		t.Errorf("Check: Command = %q, want argv[0] %q", r.Command, w.command0)
	}
	if w.resolved != "" && r.Resolved != w.resolved {
		t.Errorf("Check: Resolved = %q, want %q", r.Resolved, w.resolved)
	}
	if w.interpreter != "" && r.Interpreter != w.interpreter {
		t.Errorf("Check: Interpreter = %q, want %q", r.Interpreter, w.interpreter)
	}
	if (w.problems > 0 || w.result == ResultOK || w.result == ResultNoCommand) && len(r.Problems) != w.problems {
		t.Errorf("Check: %d problems %q, want %d", len(r.Problems), r.Problems, w.problems)
	}
	for _, s := range w.first {
		if len(r.Problems) == 0 || !strings.Contains(r.Problems[0], s) {
			t.Errorf("Check: first problem of %q does not contain %q", r.Problems, s)
		}
	}
}

func TestCheck(t *testing.T) {
	script := func(s string) []byte { return []byte(s + "echo hi\n") }
	tests := []struct {
		name  string
		setup func(m *memFS)
		spec  Spec
		want  want
	}{
		{
			name: "MergedUsrPathLookup",
			spec: Spec{Argv: []string{"python3", "-V"}},
			want: want{result: ResultOK, command0: "/usr/bin/python3", resolved: "/usr/bin/python3.11", interpreter: amd64Loader},
		},
		{
			name: "PathThroughBinLink",
			spec: Spec{Argv: []string{"sh"}, Env: []string{"PATH=/bin"}},
			want: want{result: ResultOK, command0: "/bin/sh", resolved: "/usr/bin/dash", interpreter: amd64Loader},
		},
		{
			name: "NotOnPath",
			spec: Spec{Argv: []string{"node"}, Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"}},
			want: want{result: ResultFailed, first: []string{`command "node" not found on PATH=/usr/local/bin:/usr/bin:/bin`}, problems: 1},
		},
		{
			name: "DefaultPathWhenNone",
			spec: Spec{Argv: []string{"node"}, Env: []string{"HOME=/root"}},
			want: want{result: ResultFailed, first: []string{"PATH=" + DefaultPath}, problems: 1},
		},
		{
			name: "LastPathWins",
			spec: Spec{Argv: []string{"python3"}, Env: []string{"PATH=/usr/bin", "PATH=/opt/none"}},
			want: want{result: ResultFailed, first: []string{"PATH=/opt/none"}, problems: 1},
		},
		{
			name:  "EmptyPathElementIsWorkingDir",
			setup: func(m *memFS) { m.file("/app/serve", 0o755, amd64Static) },
			spec:  Spec{Argv: []string{"serve"}, Env: []string{"PATH=/usr/bin:"}, WorkingDir: "/app"},
			want:  want{result: ResultOK, command0: "/app/serve", resolved: "/app/serve"},
		},
		{
			name: "PathSkipsNonExecutable",
			setup: func(m *memFS) {
				m.file("/usr/local/bin/python3", 0o644, amd64Dyn)
				m.dir("/usr/local/sbin/python3")
			},
			spec: Spec{Argv: []string{"python3"}},
			want: want{result: ResultOK, command0: "/usr/bin/python3", problems: 0},
		},
		{
			name:  "PathOnlyNonExecutable",
			setup: func(m *memFS) { m.file("/usr/local/bin/tool", 0o644, amd64Static) },
			spec:  Spec{Argv: []string{"tool"}},
			want:  want{result: ResultFailed, first: []string{`command "tool" not executable on PATH=`, `"/usr/local/bin/tool" is not executable (mode 0644)`}},
		},
		{
			name: "AbsoluteSymlink",
			setup: func(m *memFS) {
				m.file("/opt/app/bin/app", 0o755, amd64Dyn).link("/usr/local/bin/app", "/opt/app/bin/app")
			},
			spec: Spec{Argv: []string{"app"}},
			want: want{result: ResultOK, command0: "/usr/local/bin/app", resolved: "/opt/app/bin/app", interpreter: amd64Loader},
		},
		{
			name: "RelativeSymlink",
			setup: func(m *memFS) {
				m.file("/opt/app/bin/app", 0o755, amd64Dyn).link("/usr/local/bin/app", "../../../opt/app/bin/app")
			},
			spec: Spec{Argv: []string{"/usr/local/bin/app"}},
			want: want{result: ResultOK, resolved: "/opt/app/bin/app"},
		},
		{
			name: "SymlinkChain",
			setup: func(m *memFS) {
				m.file("/opt/app/v2/app", 0o755, amd64Dyn)
				m.link("/opt/app/current", "v2")
				m.link("/opt/app/app", "current/app")
				m.link("/usr/local/bin/app", "/opt/app/app")
			},
			spec: Spec{Argv: []string{"app"}},
			want: want{result: ResultOK, command0: "/usr/local/bin/app", resolved: "/opt/app/v2/app"},
		},
		{
			name: "DotDotStaysInRoot",
			// From /usr/local/bin, eight ".." reach the root and stay
			// there: the link names /usr/bin/dash inside the image.
			setup: func(m *memFS) { m.link("/usr/local/bin/sh2", "../../../../../../../../usr/bin/dash") },
			spec:  Spec{Argv: []string{"sh2"}},
			want:  want{result: ResultOK, resolved: "/usr/bin/dash"},
		},
		{
			name:  "SymlinkLoop",
			setup: func(m *memFS) { m.link("/usr/local/bin/a", "b").link("/usr/local/bin/b", "a") },
			spec:  Spec{Argv: []string{"/usr/local/bin/a"}},
			want:  want{result: ResultFailed, first: []string{`"/usr/local/bin/a"`, "more than 40 symlinks (a loop)"}, problems: 1},
		},
		{
			name:  "SymlinkLoopOnPathThenFound",
			setup: func(m *memFS) { m.link("/usr/local/bin/python3", "python3") },
			spec:  Spec{Argv: []string{"python3"}},
			want:  want{result: ResultWarnings, command0: "/usr/bin/python3", first: []string{"warning: ", "a loop"}, problems: 1},
		},
		{
			name:  "DanglingSymlink",
			setup: func(m *memFS) { m.link("/usr/local/bin/app", "/opt/app/bin/app") },
			spec:  Spec{Argv: []string{"app"}},
			want:  want{result: ResultFailed, first: []string{`command "app" not found on PATH=`, `"/usr/local/bin/app" is a dangling symlink to "/opt/app/bin/app" ("/opt" not found)`}, problems: 1},
		},
		{
			name:  "DanglingSymlinkAbsoluteCommand",
			setup: func(m *memFS) { m.link("/entrypoint", "/docker-entrypoint.sh") },
			spec:  Spec{Argv: []string{"/entrypoint"}},
			want:  want{result: ResultFailed, first: []string{`command "/entrypoint": "/entrypoint" is a dangling symlink to "/docker-entrypoint.sh" ("/docker-entrypoint.sh" not found)`}, problems: 1},
		},
		{
			name:  "FileAsDirectory",
			setup: func(m *memFS) { m.file("/opt/app", 0o755, amd64Static) },
			spec:  Spec{Argv: []string{"/opt/app/run"}},
			want:  want{result: ResultFailed, first: []string{`"/opt/app" is not a directory`}},
		},
		{
			name:  "RelativeScriptInWorkingDir",
			setup: func(m *memFS) { m.file("/app/run.sh", 0o755, script("#!/bin/sh\n")) },
			spec:  Spec{Argv: []string{"./run.sh", "serve"}, WorkingDir: "/app"},
			want:  want{result: ResultOK, command0: "/app/run.sh", resolved: "/app/run.sh", interpreter: "/bin/sh", problems: 0},
		},
		{
			name: "MissingWorkingDirIsCreated",
			spec: Spec{Argv: []string{"sh"}, WorkingDir: "/srv/app"},
			want: want{result: ResultOK, problems: 0},
		},
		{
			name:  "WorkingDirIsAFile",
			setup: func(m *memFS) { m.file("/app", 0o644, nil) },
			spec:  Spec{Argv: []string{"sh"}, WorkingDir: "/app"},
			want:  want{result: ResultFailed, first: []string{`working directory "/app" is a regular file, not a directory`}, problems: 1},
		},
		{
			name:  "RelativeScriptWrongWorkingDir",
			setup: func(m *memFS) { m.file("/app/run.sh", 0o755, script("#!/bin/sh\n")) },
			spec:  Spec{Argv: []string{"./run.sh"}},
			want:  want{result: ResultFailed, first: []string{`command "./run.sh" in working directory "/": "/run.sh" not found`}, problems: 1},
		},
		{
			name:  "ScriptAbsoluteInterpreter",
			setup: func(m *memFS) { m.file("/app/run.sh", 0o755, script("#!/bin/bash -e\n")) },
			spec:  Spec{Argv: []string{"/app/run.sh"}},
			want:  want{result: ResultOK, interpreter: "/bin/bash", problems: 0},
		},
		{
			name:  "ScriptEnvName",
			setup: func(m *memFS) { m.file("/app/main.py", 0o755, script("#!/usr/bin/env python3\n")) },
			spec:  Spec{Argv: []string{"/app/main.py"}},
			want:  want{result: ResultOK, interpreter: "/usr/bin/python3", problems: 0},
		},
		{
			name: "ScriptEnvSplit",
			setup: func(m *memFS) {
				m.file("/app/main.py", 0o755, script("#!/usr/bin/env -S PYTHONUNBUFFERED=1 python3 -u\n"))
			},
			spec: Spec{Argv: []string{"/app/main.py"}},
			want: want{result: ResultOK, interpreter: "/usr/bin/python3", problems: 0},
		},
		{
			name:  "ScriptEnvNameMissing",
			setup: func(m *memFS) { m.file("/app/index.js", 0o755, script("#!/usr/bin/env node\n")) },
			spec:  Spec{Argv: []string{"/app/index.js"}, Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"}},
			want:  want{result: ResultFailed, first: []string{`"/app/index.js"`, `command "node" not found on PATH=/usr/local/bin:/usr/bin:/bin`}, problems: 1},
		},
		{
			name:  "ScriptInterpreterMissing",
			setup: func(m *memFS) { m.file("/app/run.sh", 0o755, script("#!/bin/zsh\n")) },
			spec:  Spec{Argv: []string{"/app/run.sh"}},
			want:  want{result: ResultFailed, first: []string{`"/app/run.sh": interpreter "/bin/zsh" not found`}, problems: 1},
		},
		{
			name: "ScriptInterpreterNotExecutable",
			setup: func(m *memFS) {
				m.file("/usr/bin/ruby", 0o644, amd64Dyn).file("/app/run.rb", 0o755, script("#!/usr/bin/ruby\n"))
			},
			spec: Spec{Argv: []string{"/app/run.rb"}},
			want: want{result: ResultFailed, first: []string{`"/app/run.rb": interpreter "/usr/bin/ruby" is not executable (mode 0644)`}, problems: 1},
		},
		{
			name: "ScriptInterpreterWrongArch",
			setup: func(m *memFS) {
				m.file("/usr/bin/ruby", 0o755, arm64Dyn).file("/app/run.rb", 0o755, script("#!/usr/bin/ruby\n"))
			},
			spec: Spec{Argv: []string{"/app/run.rb"}},
			want: want{result: ResultFailed, first: []string{`"/app/run.rb": interpreter "/usr/bin/ruby" is an ELF for AArch64, the image is amd64`}, problems: 1},
		},
		{
			name:  "ScriptCRLF",
			setup: func(m *memFS) { m.file("/app/run.sh", 0o755, []byte("#!/bin/sh\r\necho hi\r\n")) },
			spec:  Spec{Argv: []string{"/app/run.sh"}},
			want:  want{result: ResultFailed, first: []string{`"/app/run.sh": interpreter "/bin/sh" not found`, `looks for "/bin/sh\r"`, "CRLF"}, problems: 1},
		},
		{
			name:  "ScriptEnvCRLF",
			setup: func(m *memFS) { m.file("/app/main.py", 0o755, []byte("#!/usr/bin/env python3\r\nprint(1)\r\n")) },
			spec:  Spec{Argv: []string{"/app/main.py"}},
			want:  want{result: ResultFailed, first: []string{`"/app/main.py"`, `"python3\r"`, "CRLF"}, problems: 1},
		},
		{
			name:  "ScriptArgumentCRLF",
			setup: func(m *memFS) { m.file("/app/run.sh", 0o755, []byte("#!/bin/sh -e\r\necho hi\r\n")) },
			spec:  Spec{Argv: []string{"/app/run.sh"}},
			want:  want{result: ResultWarnings, first: []string{"warning: ", "CRLF"}, problems: 1},
		},
		{
			name: "ScriptNestedInterpreterNotFollowed",
			setup: func(m *memFS) {
				m.file("/usr/local/bin/wrapper", 0o755, script("#!/bin/zsh\n")).file("/app/run", 0o755, script("#!/usr/local/bin/wrapper\n"))
			},
			spec: Spec{Argv: []string{"/app/run"}},
			want: want{result: ResultOK, interpreter: "/usr/local/bin/wrapper", problems: 0},
		},
		{
			name:  "ELFOtherArchitecture",
			setup: func(m *memFS) { m.file("/usr/bin/tool", 0o755, arm64Static) },
			spec:  Spec{Argv: []string{"tool"}},
			want:  want{result: ResultFailed, first: []string{`"/usr/bin/tool" is an ELF for AArch64, the image is amd64`}, problems: 1},
		},
		{
			name: "ELFWrongClass",
			setup: func(m *memFS) {
				m.file("/usr/bin/tool", 0o755, mkELF(elfOpts{class: elf.ELFCLASS32, machine: elf.EM_X86_64}))
			},
			spec: Spec{Argv: []string{"tool"}},
			want: want{result: ResultFailed, first: []string{`"/usr/bin/tool" is an ELF for x86-64 (32-bit, little-endian), the image is amd64`}},
		},
		{
			name: "ELFCompat32Bit",
			setup: func(m *memFS) {
				m.file("/usr/bin/tool", 0o755, mkELF(elfOpts{class: elf.ELFCLASS32, machine: elf.EM_386}))
			},
			spec: Spec{Argv: []string{"tool"}},
			want: want{result: ResultWarnings, first: []string{"warning: ", "Intel 80386", "compatibility"}, problems: 1},
		},
		{
			name: "ELFRelocatable",
			setup: func(m *memFS) {
				m.file("/usr/bin/tool.o", 0o755, mkELF(elfOpts{machine: elf.EM_X86_64, typ: elf.ET_REL}))
			},
			spec: Spec{Argv: []string{"tool.o"}},
			want: want{result: ResultFailed, first: []string{`"/usr/bin/tool.o" is an ELF rel, not an executable`}},
		},
		{
			name:  "ELFTruncated",
			setup: func(m *memFS) { m.file("/usr/bin/tool", 0o755, amd64Dyn[:40]) },
			spec:  Spec{Argv: []string{"tool"}},
			want:  want{result: ResultFailed, first: []string{`"/usr/bin/tool" is a truncated ELF file (40 bytes)`}},
		},
		{
			name: "ELFLoaderBeyondFirstRead",
			setup: func(m *memFS) {
				m.file("/usr/bin/tool", 0o755, mkELF(elfOpts{machine: elf.EM_X86_64, typ: elf.ET_DYN, interp: "/lib/ld-musl-x86_64.so.1", pad: 6000}))
			},
			spec: Spec{Argv: []string{"tool"}},
			want: want{result: ResultFailed, first: []string{`"/usr/bin/tool": loader "/lib/ld-musl-x86_64.so.1" not found`}, problems: 1},
		},
		{
			name: "ArmImageLoaderMissing",
			setup: func(m *memFS) {
				m.file("/usr/local/bin/server", 0o755, arm64Dyn)
			},
			spec: Spec{Argv: []string{"server"}, Arch: "arm64"},
			want: want{result: ResultFailed, first: []string{`"/usr/local/bin/server": loader "/lib/ld-linux-aarch64.so.1" not found`}, problems: 1},
		},
		{
			name: "ArmImageLoaderPresent",
			setup: func(m *memFS) {
				m.file("/usr/local/bin/server", 0o755, arm64Dyn)
				m.file("/usr/lib/aarch64-linux-gnu/ld-linux-aarch64.so.1", 0o755, mkELF(elfOpts{machine: elf.EM_AARCH64, typ: elf.ET_DYN}))
				m.link("/usr/lib/ld-linux-aarch64.so.1", "aarch64-linux-gnu/ld-linux-aarch64.so.1")
			},
			spec: Spec{Argv: []string{"server"}, Arch: "arm64"},
			want: want{result: ResultOK, interpreter: arm64Loader, problems: 0},
		},
		{
			name: "LoaderOfOtherArchitecture",
			setup: func(m *memFS) {
				m.file("/usr/local/bin/server", 0o755, arm64Dyn)
				m.file("/usr/lib/ld-linux-aarch64.so.1", 0o755, amd64Lib)
			},
			spec: Spec{Argv: []string{"server"}, Arch: "arm64"},
			want: want{result: ResultFailed, first: []string{`loader "/lib/ld-linux-aarch64.so.1" (-> "/usr/lib/ld-linux-aarch64.so.1") is an ELF for x86-64, the image is arm64`}},
		},
		{
			name: "BigEndianImage",
			setup: func(m *memFS) {
				m.file("/usr/bin/tool", 0o755, mkELF(elfOpts{machine: elf.EM_S390, order: binary.BigEndian}))
			},
			spec: Spec{Argv: []string{"/bin/tool"}, Arch: "s390x"},
			want: want{result: ResultOK, problems: 0},
		},
		{
			name:  "DirectoryAsCommand",
			setup: func(m *memFS) { m.dir("/app") },
			spec:  Spec{Argv: []string{"/app"}},
			want:  want{result: ResultFailed, first: []string{`"/app" is a directory`}, problems: 1},
		},
		{
			name:  "NonExecutableCommand",
			setup: func(m *memFS) { m.file("/app/server", 0o644, amd64Static) },
			spec:  Spec{Argv: []string{"/app/server"}},
			want:  want{result: ResultFailed, first: []string{`"/app/server" is not executable (mode 0644)`}, problems: 1},
		},
		{
			name:  "NotAnExecutableFormat",
			setup: func(m *memFS) { m.file("/app/run.sh", 0o755, []byte("echo no shebang\n")) },
			spec:  Spec{Argv: []string{"/app/run.sh"}},
			want:  want{result: ResultFailed, first: []string{`"/app/run.sh" is not an executable format`}, problems: 1},
		},
		{
			name: "EmptyArgv0",
			spec: Spec{Argv: []string{""}},
			want: want{result: ResultFailed, first: []string{"empty"}, problems: 1},
		},
		{
			name: "NoCommand",
			spec: Spec{},
			want: want{result: ResultNoCommand, problems: 0},
		},
		{
			name: "NamedUserPresent",
			spec: Spec{Argv: []string{"sh"}, User: "www-data:www-data"},
			want: want{result: ResultOK, problems: 0},
		},
		{
			name: "NumericUserNeedsNoEntry",
			spec: Spec{Argv: []string{"sh"}, User: "1000:1000"},
			want: want{result: ResultOK, problems: 0},
		},
		{
			name: "NamedUserAbsent",
			spec: Spec{Argv: []string{"sh"}, User: "app"},
			want: want{result: ResultFailed, first: []string{`user "app" not found in /etc/passwd`}, problems: 1},
		},
		{
			name: "NamedGroupAbsent",
			spec: Spec{Argv: []string{"sh"}, User: "1000:app"},
			want: want{result: ResultFailed, first: []string{`group "app" not found in /etc/group`}, problems: 1},
		},
		{
			name:  "NoPasswd",
			setup: func(m *memFS) { delete(m.entries, "/etc/passwd") },
			spec:  Spec{Argv: []string{"sh"}, User: "nobody"},
			want:  want{result: ResultFailed, first: []string{`user "nobody": /etc/passwd not found in the image`}, problems: 1},
		},
		{
			name:  "EnvdStatic",
			setup: func(m *memFS) { m.file("/usr/local/bin/envd", 0o755, amd64Static) },
			spec:  Spec{Argv: []string{"sh"}, Envd: "/usr/local/bin/envd"},
			want:  want{result: ResultOK, problems: 0},
		},
		{
			name:  "EnvdWrongArchitecture",
			setup: func(m *memFS) { m.file("/usr/local/bin/envd", 0o755, arm64Static) },
			spec:  Spec{Argv: []string{"sh"}, Envd: "/usr/local/bin/envd"},
			want:  want{result: ResultFailed, first: []string{`envd "/usr/local/bin/envd" is an ELF for AArch64, the image is amd64`}, problems: 1},
		},
		{
			name: "EnvdLoaderMissing",
			setup: func(m *memFS) {
				m.file("/usr/local/bin/envd", 0o755, mkELF(elfOpts{machine: elf.EM_X86_64, typ: elf.ET_DYN, interp: "/lib/ld-musl-x86_64.so.1"}))
			},
			spec: Spec{Argv: []string{"sh"}, Envd: "/usr/local/bin/envd"},
			want: want{result: ResultFailed, first: []string{`envd "/usr/local/bin/envd": loader "/lib/ld-musl-x86_64.so.1" not found`}, problems: 1},
		},
		{
			name:  "EnvdChecksWithoutCommand",
			setup: func(m *memFS) { m.file("/usr/local/bin/envd", 0o755, arm64Static) },
			spec:  Spec{Envd: "/usr/local/bin/envd"},
			want:  want{result: ResultFailed, first: []string{"envd", "AArch64"}, problems: 1},
		},
		{
			name:  "CertainProblemsFirst",
			setup: func(m *memFS) { m.link("/usr/local/bin/sh", "sh") },
			spec:  Spec{Argv: []string{"sh"}, User: "ghost"},
			want:  want{result: ResultFailed, first: []string{`user "ghost"`}, problems: 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := debianAmd64()
			if tt.setup != nil {
				tt.setup(m)
			}
			if tt.spec.Arch == "" {
				tt.spec.Arch = "amd64"
			}
			r := Check(m, tt.spec)
			t.Logf("Check = %s", mustJSON(t, r))
			expect(t, r, tt.want)
			for p, n := range m.reads {
				if n > maxHead && !strings.HasPrefix(p, "/etc/") {
					t.Errorf("Check read %d bytes of %q, more than %d", n, p, maxHead)
				}
			}
		})
	}
}

// TestCheckHostBinary runs the check on the host's own dynamic binary and
// its loader, read from the host tree: real ELF files, not crafted ones.
func TestCheckHostBinary(t *testing.T) {
	bin := "/bin/true"
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Skipf("no %s: %v", bin, err)
	}
	info, err := parseELF(data[:min(len(data), headSize)])
	if err != nil {
		t.Fatalf("parseELF(%s): %v", bin, err)
	}
	if info.interp == "" {
		t.Skipf("%s is static", bin)
	}
	loader, err := os.ReadFile(info.interp)
	if err != nil {
		t.Fatalf("read the host loader %s: %v", info.interp, err)
	}
	m := newFS()
	m.file("/usr/bin/true", 0o755, data).file(info.interp, 0o755, loader)
	r := Check(m, Spec{Argv: []string{"true"}, Arch: runtime.GOARCH})
	expect(t, r, want{result: ResultFailed, first: []string{`library "libc.so.6" needed by "/usr/bin/true" not found`}})
	// With the libraries it needs, from the host's system directories.
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	needed, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	for _, lib := range needed {
		for _, dir := range archOf(identOf(info)).defaultDirs() {
			if b, err := os.ReadFile(dir + "/" + lib); err == nil {
				m.file(dir+"/"+lib, 0o644, b)
				break
			}
		}
	}
	r = Check(m, Spec{Argv: []string{"true"}, Arch: runtime.GOARCH})
	expect(t, r, want{result: ResultOK, command0: "/usr/bin/true", interpreter: info.interp, problems: 0})
	if len(r.Libraries) < len(needed) {
		t.Errorf("Check: Libraries = %v, want the %d the binary needs", r.Libraries, len(needed))
	}

	other := "arm64"
	if runtime.GOARCH == "arm64" {
		other = "amd64"
	}
	r = Check(m, Spec{Argv: []string{"true"}, Arch: other})
	expect(t, r, want{result: ResultFailed, first: []string{`"/usr/bin/true" is an ELF for`, "the image is " + other}, problems: 0})
}

func TestEffective(t *testing.T) {
	uid := int64(1000)
	image := struct {
		entrypoint, cmd, env []string
		wd, user             string
	}{[]string{"/docker-entrypoint.sh"}, []string{"nginx", "-g", "daemon off;"}, []string{"PATH=/usr/bin:/bin", "LANG=C"}, "/srv", "www-data"}
	tests := []struct {
		name string
		o    Overrides
		want Spec
	}{
		{"ImageDefaults", Overrides{},
			Spec{Argv: []string{"/docker-entrypoint.sh", "nginx", "-g", "daemon off;"}, Env: []string{"PATH=/usr/bin:/bin", "LANG=C"}, WorkingDir: "/srv", User: "www-data"}},
		{"CommandDropsCmd", Overrides{Command: []string{"/bin/sh"}},
			Spec{Argv: []string{"/bin/sh"}, Env: image.env, WorkingDir: "/srv", User: "www-data"}},
		{"CommandAndArgs", Overrides{Command: []string{"/bin/sh"}, Args: []string{"-c", "true"}},
			Spec{Argv: []string{"/bin/sh", "-c", "true"}, Env: image.env, WorkingDir: "/srv", User: "www-data"}},
		{"ArgsKeepEntrypoint", Overrides{Args: []string{"httpd"}},
			Spec{Argv: []string{"/docker-entrypoint.sh", "httpd"}, Env: image.env, WorkingDir: "/srv", User: "www-data"}},
		{"EnvOnTop", Overrides{Env: []string{"PATH=/opt/bin", "DEBUG=1"}},
			Spec{Argv: []string{"/docker-entrypoint.sh", "nginx", "-g", "daemon off;"}, Env: []string{"PATH=/opt/bin", "LANG=C", "DEBUG=1"}, WorkingDir: "/srv", User: "www-data"}},
		{"WorkingDirAndUsername", Overrides{WorkingDir: "/app", RunAsUsername: "app", RunAsUser: &uid},
			Spec{Argv: []string{"/docker-entrypoint.sh", "nginx", "-g", "daemon off;"}, Env: image.env, WorkingDir: "/app", User: "app"}},
		{"RunAsUser", Overrides{RunAsUser: &uid},
			Spec{Argv: []string{"/docker-entrypoint.sh", "nginx", "-g", "daemon off;"}, Env: image.env, WorkingDir: "/srv", User: "1000"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Effective(image.entrypoint, image.cmd, image.env, image.wd, image.user, tt.o)
			if g, w := mustJSON(t, got), mustJSON(t, tt.want); g != w {
				t.Errorf("Effective = %s, want %s", g, w)
			}
		})
	}
	t.Run("Empty", func(t *testing.T) {
		got := Effective(nil, nil, nil, "", "", Overrides{})
		if got.Argv != nil || got.WorkingDir != "/" || got.User != "" {
			t.Errorf("Effective(empty) = %+v, want no argv, working dir /, root", got)
		}
		if r := Check(debianAmd64(), got); r.Result != ResultNoCommand {
			t.Errorf("Check(no command) = %+v, want %q", r, ResultNoCommand)
		}
	})
	t.Run("DoesNotAlias", func(t *testing.T) {
		cmd := []string{"a", "b"}
		got := Effective(nil, cmd, nil, "", "", Overrides{})
		got.Argv[0] = "x"
		if cmd[0] != "a" {
			t.Errorf("Effective shares the image Cmd's array")
		}
	})
}

// TestOverridesEndToEnd runs the check on specs from Effective: the
// override repairs (or breaks) what the image config says.
func TestOverridesEndToEnd(t *testing.T) {
	m := debianAmd64()
	m.file("/app/server", 0o755, amd64Dyn)
	m.file("/etc/passwd", 0o644, []byte("root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/app:/bin/sh\n"))
	check := func(o Overrides) Result {
		s := Effective([]string{"/missing-entrypoint"}, []string{"serve"}, []string{"PATH=/nowhere"}, "", "ghost", o)
		s.Arch = "amd64"
		return Check(m, s)
	}
	r := check(Overrides{})
	if !r.Failed() || !strings.Contains(r.Problems[0], `"/missing-entrypoint" not found`) {
		t.Errorf("Check(image config) = %+v, want the missing entrypoint", r)
	}
	r = check(Overrides{Command: []string{"./server"}, WorkingDir: "/app", RunAsUsername: "app"})
	expect(t, r, want{result: ResultOK, command0: "/app/server", problems: 0})
	if slices.Contains(r.Command, "serve") {
		t.Errorf("Check: Command = %q keeps the image Cmd after a command override", r.Command)
	}
	r = check(Overrides{Command: []string{"python3"}, Env: []string{"PATH=/usr/bin"}, RunAsUser: new(int64)})
	expect(t, r, want{result: ResultOK, command0: "/usr/bin/python3", problems: 0})
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestResultJSON(t *testing.T) {
	r := Check(debianAmd64(), Spec{Argv: []string{"python3"}, Arch: "amd64"})
	got := mustJSON(t, r)
	want := `{"result":"ok","command":["/usr/bin/python3"],"resolved":"/usr/bin/python3.11","interpreter":"/lib64/ld-linux-x86-64.so.2"}`
	if got != want {
		t.Errorf("json.Marshal(Check) = %s, want %s", got, want)
	}
}
