// Package system tests how CubeTemplateCenter is installed and operated: the
// systemd units offline (systemd-analyze verify and security), the .deb and
// .rpm packages (contents, dependencies, scripts, lintian), install.sh, and an
// end-to-end suite that boots Debian under a real systemd in a
// systemd-nspawn container, installs the agent there and drives it against
// the CubeMaster stand-in of test/cubemaster. The package holds tests only.
package system
