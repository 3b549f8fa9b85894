// Package startcheck checks statically, on an image's file tree, that its
// start command can run: the command resolves on the effective PATH inside
// the image, is an executable file of the image's architecture, its ELF
// loader or script interpreter exists, the user exists, and the injected
// envd matches the platform. It reads only headers through the FS
// interface and imports nothing of the module, so the builder (on its
// in-memory tree) and the inspect command (on a finished image) share it.
//
// The check resolves every symlink itself: it calls FS.Lstat only on
// paths whose parents are real directories, and FS.ReadHead only on
// resolved regular files, so an FS never needs to follow a symlink. Reads
// are bounded: 4 KiB of a file, 64 KiB when an ELF's program headers or
// loader path lie further, 1 MiB of /etc/passwd and /etc/group.
//
// Problems are certain (the runtime would fail the same way: Result
// "failed") or uncertain (warnings, prefixed "warning: "); certain ones
// come first in Problems.
package startcheck
