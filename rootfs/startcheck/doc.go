// Package startcheck checks statically, on an image's file tree, that its
// start command can run: the command resolves on the effective PATH inside
// the image, is an executable file of the image's architecture, its ELF
// loader or script interpreter exists, the user exists, and the injected
// envd matches the platform. It reads only headers through the FS
// interface and imports nothing of the module, so the builder (on its
// in-memory tree) and the inspect command (on a finished image) share it.
//
// Problems are certain (the runtime would fail the same way: Result
// "failed") or uncertain (warnings, prefixed "warning: "); certain ones
// come first in Problems.
package startcheck
