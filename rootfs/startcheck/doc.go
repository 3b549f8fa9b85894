// Package startcheck checks statically, on an image's file tree, that its
// start command can run: the command resolves on the effective PATH inside
// the image, is an executable file of the image's architecture that the
// effective user may execute, its ELF loader or script interpreter exists,
// the shared libraries and symbol versions the loader would load are
// there (searched as glibc's or musl's loader searches), the user exists,
// and the injected envd matches the platform. It reads only what it needs
// through the FS interface and imports nothing of the module, so the
// builder (on its in-memory tree) and the inspect command (on a finished
// image) share it.
//
// The check resolves every symlink itself: it calls FS.Lstat only on
// paths whose parents are real directories, and FS.ReadHead and
// FS.ReadAt only on resolved regular files, so an FS never needs to
// follow a symlink. Reads are bounded: 4 KiB of a file, 64 KiB when an
// ELF's program headers or loader path lie further, 1 MiB of /etc/passwd
// and /etc/group, 4 MiB of /etc/ld.so.cache; of a shared object the pages
// the loader reads (its dynamic section, string and version tables,
// wherever they lie), at most 4 MiB of one and 32 MiB in one check.
//
// Work and output are bounded whatever the image config says: a lookup
// tries the first 256 PATH entries (and of each library search path), a
// check makes at most 4096 lookups and follows at most 1024 symlinks,
// loads at most 256 libraries nested at most 16 deep, a path longer than
// PATH_MAX or a name longer than NAME_MAX fails as it does in the kernel,
// and every name in a message is quoted and cut (rootfs/safetext). A check
// cut short says so in a warning. Result.Bounded keeps a result's JSON,
// the BUILT report's template_check, within safetext.TemplateCheckMax.
//
// Problems are certain (the runtime would fail the same way: Result
// "failed") or uncertain (warnings, prefixed "warning: "); certain ones
// come first in Problems. What the loader would do is checked against the
// loader itself, run in real trees (oracle_test.go).
package startcheck
