#!/bin/sh
# upstream-check.sh: find an upstream CubeTemplateCenter on this machine
# before CubeTemplateCenter is installed over it. The .deb runs it as its
# preinst, the .rpm as its %pre, install.sh before it changes anything.
#
# Upstream runs as root from its own unit (cube-sandbox-cube-templatecenter,
# the same name as ours, or the older cube-sandbox-cubetemplatecenter),
# listens on port 8090 and leaves a root-owned artifact store. Installing
# over it used to end with the old process still on the port while the
# package reported success, and with a store the unprivileged agent could
# not delete from. So this script changes nothing of upstream's: when it
# finds upstream in the way, it lists what it found and the exact commands
# that hand the machine over, and fails, so the installation stops before
# anything is unpacked.
#
# Usage (the first argument is what dpkg or rpm pass):
#   upstream-check.sh install|upgrade|1|2   check; exit 1 with the report
#   upstream-check.sh abort-upgrade         nothing to do
#   upstream-check.sh take-over             run the commands that stop,
#                                           disable and set aside upstream's
#                                           units (install.sh --take-over)
#   upstream-check.sh adopt-store           run the command that grants the
#                                           agent access to the store
#                                           (install.sh --adopt-store)
# Environment: TC_CHECK_CREATE_USER=0 leaves the system user alone (a dry
# run); TC_CHECK_WHO names the installer in the report.
#
# The script creates the system user cube-templatecenter first (as a
# package's %pre usually does): the store check runs as that user, and the
# commands it prints name it. docs/upstream.md, "Migrating from upstream",
# explains each step and how to roll back.

set -e

SERVICE=cube-sandbox-cube-templatecenter.service
OLD_SERVICE=cube-sandbox-cubetemplatecenter.service
USER_NAME=cube-templatecenter
STORE=/data/CubeMaster/storage
PORT=8090
# Where upstream's unit files are moved: out of systemd's search path, and
# outside anything a purge of this package deletes.
ASIDE=/var/backups/cube-templatecenter-upstream
WHO=${TC_CHECK_WHO:-cube-templatecenter}

mode=${1:-install}
case $mode in
abort-upgrade | abort-install) exit 0 ;;
esac

# ensure_user creates the system user, as sysusers.d/cube-templatecenter.conf
# would (the file itself is not unpacked yet).
ensure_user() {
	[ "${TC_CHECK_CREATE_USER:-1}" = 1 ] || return 0
	getent passwd "$USER_NAME" >/dev/null && return 0
	if command -v systemd-sysusers >/dev/null 2>&1; then
		echo "u $USER_NAME - \"Cube Sandbox CubeTemplateCenter\" /var/lib/cube-templatecenter" |
			systemd-sysusers - && return 0
	fi
	nologin=/usr/sbin/nologin
	[ -x "$nologin" ] || nologin=/sbin/nologin
	useradd --system --user-group --home-dir /var/lib/cube-templatecenter --no-create-home \
		--shell "$nologin" --comment "Cube Sandbox CubeTemplateCenter" "$USER_NAME"
}

# unit_dirs lists the directories systemd loads system units from that an
# installer writes to, each once (/lib is /usr/lib on merged-/usr systems).
unit_dirs() {
	seen=" "
	for d in /etc/systemd/system /lib/systemd/system /usr/lib/systemd/system; do
		[ -d "$d" ] || continue
		real=$(readlink -f "$d")
		case $seen in
		*" $real "*) ;;
		*) seen="$seen$real " && echo "$d" ;;
		esac
	done
}

# ours tells whether a unit file is this project's: its ExecStart= runs
# `templatecenter serve` (the package's and install.sh's units do; upstream's
# runs a start script).
ours() {
	[ -f "$1" ] && [ ! -L "$1" ] && grep -q '^ExecStart=.*/templatecenter serve' "$1"
}

# enabled_links prints the enablement symlinks of unit $1 under /etc.
enabled_links() {
	find /etc/systemd/system -mindepth 2 -maxdepth 2 \( -type l -o -type f \) -name "$1" \
		\( -path '*.wants/*' -o -path '*.requires/*' \) 2>/dev/null
}

FOUND=""
SERVICE_FIX=""
STORE_FIX=""
nl='
'
found() { FOUND="$FOUND  - $*$nl"; }
service_fix() {
	case "$nl$SERVICE_FIX" in
	*"$nl$1$nl"*) ;;
	*) SERVICE_FIX="$SERVICE_FIX$1$nl" ;;
	esac
}

# check_units: upstream's unit files, under either name.
check_units() {
	for dir in $(unit_dirs); do
		for unit in $SERVICE $OLD_SERVICE; do
			f=$dir/$unit
			[ -e "$f" ] || [ -L "$f" ] || continue
			if [ "$unit" = "$SERVICE" ] && ours "$f"; then
				continue
			fi
			links=$(enabled_links "$unit")
			if [ "$unit" = "$OLD_SERVICE" ] && [ -z "$links" ]; then
				# The older unit is installed disabled: harmless, and
				# the port check below catches it if it runs anyway.
				continue
			fi
			what="upstream's unit"
			[ -n "$links" ] && what="$what, enabled"
			if [ "$unit" = "$SERVICE" ]; then
				found "$f is $what: it has this package's unit name and would shadow or replace it"
			else
				found "$f is $what: upstream's service would start at boot next to this one"
			fi
			service_fix "systemctl disable --now $unit"
			service_fix "mkdir -p $ASIDE"
			service_fix "mv $f $ASIDE/"
		done
	done
}

# listeners prints the socket inodes listening on $PORT (any address).
listeners() {
	hex=$(printf '%04X' "$PORT")
	for f in /proc/net/tcp /proc/net/tcp6; do
		[ -r "$f" ] || continue
		# local_address is ADDR:PORT in hex; state 0A is LISTEN.
		awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { print $10 }' "$f"
	done
}

# check_port: a process other than systemd's socket (PID 1: this package's
# socket unit on an upgrade) listening on the port.
check_port() {
	for inode in $(listeners); do
		[ "$inode" != 0 ] || continue
		holders=""
		pid1=false
		# shellcheck disable=SC2044 # /proc/PID/fd/N has no blanks
		for fd in $(find /proc/[0-9]*/fd -lname "socket:\[$inode\]" 2>/dev/null); do
			pid=${fd#/proc/}
			pid=${pid%%/*}
			[ "$pid" = 1 ] && pid1=true
			holders="$holders $pid"
		done
		$pid1 && continue
		if [ -z "$holders" ]; then
			found "port $PORT is in use by a process this script cannot see (another container or namespace?)"
			continue
		fi
		for pid in $holders; do
			comm=$(cat "/proc/$pid/comm" 2>/dev/null) || comm=gone
			unit=$(sed -n 's#^0::.*/\([^/]*\.service\)$#\1#p' "/proc/$pid/cgroup" 2>/dev/null | head -n 1)
			if [ -n "$unit" ]; then
				found "port $PORT is held by $comm (pid $pid) of $unit"
				service_fix "systemctl disable --now $unit"
			else
				found "port $PORT is held by $comm (pid $pid), not a systemd service"
				service_fix "kill $pid"
			fi
		done
	done
}

# check_store: every directory of an existing store must be writable by the
# agent's user, or old artifacts cannot be deleted. The store keeps its
# owner and mode; access is the operator's explicit step (an ACL entry for
# the user on each directory).
check_store() {
	[ -d "$STORE" ] || return 0
	owner=$(stat -c '%U:%G %a' "$STORE")
	if getent passwd "$USER_NAME" >/dev/null && command -v setpriv >/dev/null 2>&1; then
		# As the agent's user: access(2) honours ACLs.
		denied=$(setpriv --reuid="$USER_NAME" --regid="$USER_NAME" --clear-groups \
			find "$STORE" -type d \( ! -writable -o ! -executable \) -print -quit 2>/dev/null) ||
			denied=${denied:-$STORE}
	else
		denied=$(find "$STORE" -type d ! -user "$USER_NAME" -print -quit 2>/dev/null) || denied=$STORE
	fi
	[ -n "$denied" ] || return 0
	STORE_FIX="find $STORE -type d -exec setfacl -m u:$USER_NAME:rwx {} +"
	if [ "$upgrade" = true ]; then
		# An upgrade or reinstall of this package is not held back
		# for old artifacts: the agent runs, and fails their deletes.
		echo "$WHO: warning: the artifact store $STORE has directories $USER_NAME cannot write, starting with $denied: deleting old artifacts there fails until you run: $STORE_FIX" >&2
		STORE_FIX=""
		return 0
	fi
	found "the artifact store $STORE ($owner) has directories the agent's user $USER_NAME cannot write, starting with $denied: it could neither build into it nor delete old artifacts"
}

# This package was here before: dpkg says "upgrade", or "install" with the
# version whose configuration a remove kept; rpm 2 or more. A store problem
# is then a warning: the store is the one this package has been using.
upgrade=false
case $mode in
upgrade | [2-9]) upgrade=true ;;
install) [ -z "${2:-}" ] || upgrade=true ;;
esac

ensure_user
check_units
check_port
case "$SERVICE_FIX" in
*"${nl}mv "*) service_fix "systemctl daemon-reload" ;;
esac
check_store

run_fixes() {
	# The last command may lack its newline.
	printf '%s\n' "$1" | while IFS= read -r cmd; do
		[ -n "$cmd" ] || continue
		echo "+ $cmd"
		sh -c "$cmd" || exit 1
	done
}

case $mode in
take-over)
	if [ -z "$SERVICE_FIX" ]; then
		echo "$WHO: no upstream unit or process found to take over"
		exit 0
	fi
	run_fixes "$SERVICE_FIX"
	exit
	;;
adopt-store)
	if [ -n "$STORE_FIX" ] && ! command -v setfacl >/dev/null 2>&1; then
		echo "$WHO: setfacl is missing: install the acl package (apt-get install acl, or dnf install acl)" >&2
		exit 1
	fi
	run_fixes "$STORE_FIX"
	exit
	;;
esac

[ -n "$FOUND" ] || exit 0

{
	echo "$WHO: an upstream CubeTemplateCenter is in the way; nothing was changed:"
	printf '%s' "$FOUND"
	echo "To hand this machine over (docs/upstream.md, \"Migrating from upstream\"), run as root:"
	printf '%s%s' "$SERVICE_FIX" "${STORE_FIX:+$STORE_FIX$nl}" | sed 's/^/    /'
	if [ -n "$STORE_FIX" ] && ! command -v setfacl >/dev/null 2>&1; then
		echo "  (setfacl comes with the acl package: apt-get install acl, or dnf install acl)"
	fi
	echo "then install again. Upstream's configuration stays where it is, its unit files in $ASIDE."
} >&2
exit 1
