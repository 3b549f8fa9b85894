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

# The fixes are records, never command lines: one line each, a verb and its
# arguments (see fix_cmd), every argument a plain word. fix_cmd turns a
# record into the command's argument vector, which is either run as it is or
# shell-quoted for a person to paste: no shell ever parses what this script
# read from the system. Parts of a record come from /proc (a PID, a unit
# name), and a cgroup's name is whatever its owner chose.
FOUND=""
SERVICE_FIX=""
STORE_FIX=""
nl='
'
found() { FOUND="$FOUND  - $*$nl"; }

# plain_word tells whether $1 is a nonempty word a shell reads as itself.
plain_word() {
	case $1 in
	'' | *[!A-Za-z0-9_./:@+-]*) return 1 ;;
	esac
}

# fix_record VERB [ARG...] prints the record of one fix; it stops the script
# on an argument that is not a plain word (a record is split on blanks).
fix_record() {
	for arg in "$@"; do
		if ! plain_word "$arg"; then
			printf '%s: refusing a fix with an argument that is not a plain word: %s\n' "$WHO" "$(printable 200 "$arg")" >&2
			exit 2
		fi
	done
	printf '%s\n' "$*"
}

# service_fix VERB [ARG...] adds a fix that hands the port and the units
# over, once.
service_fix() {
	rec=$(fix_record "$@") || exit 2
	case "$nl$SERVICE_FIX" in
	*"$nl$rec$nl"*) ;;
	*) SERVICE_FIX="$SERVICE_FIX$rec$nl" ;;
	esac
}

# fix_cmd HOW VERB [ARG...] passes the command line of a fix to cmd HOW:
#   disable UNIT       systemctl disable --now UNIT
#   mkdir DIR          mkdir -p DIR
#   mv FILE DIR        mv FILE DIR/
#   daemon-reload      systemctl daemon-reload
#   kill PID           kill PID
#   setfacl DIR USER   find DIR -type d -exec setfacl -m u:USER:rwx {} +
fix_cmd() {
	fix_how=$1 fix_verb=$2
	shift 2
	case $fix_verb in
	disable) cmd "$fix_how" systemctl disable --now "$1" ;;
	mkdir) cmd "$fix_how" mkdir -p "$1" ;;
	mv) cmd "$fix_how" mv "$1" "$2/" ;;
	daemon-reload) cmd "$fix_how" systemctl daemon-reload ;;
	kill) cmd "$fix_how" kill "$1" ;;
	setfacl) cmd "$fix_how" find "$1" -type d -exec setfacl -m "u:$2:rwx" {} + ;;
	*)
		echo "$WHO: unknown fix $fix_verb" >&2
		return 2
		;;
	esac
}

# each_fix HOW RECORDS runs fix_cmd HOW on each record, stopping at the
# first that fails.
each_fix() {
	while IFS=' ' read -r each_verb each_1 each_2; do
		[ -n "$each_verb" ] || continue
		fix_cmd "$1" "$each_verb" "$each_1" "$each_2" || return 1
	done <<EOF
$2
EOF
}

# cmd HOW COMMAND [ARG...]: HOW is words (print the command line for a
# person, shell-quoted), show (the same, a line) or run (show it after a +,
# then run it, its stdin not each_fix's records).
cmd() {
	cmd_how=$1
	shift
	case $cmd_how in
	words) words "$@" ;;
	show) printf '%s\n' "$(words "$@")" ;;
	run)
		printf '+ %s\n' "$(words "$@")"
		"$@" </dev/null
		;;
	esac
}

# words prints its arguments as a shell command line.
words() {
	sep=
	for word in "$@"; do
		printf '%s' "$sep"
		quote "$word"
		sep=' '
	done
}

# quote prints $1 as one shell word: as it is if it is plain, else in
# single quotes.
quote() {
	if plain_word "$1" || [ "$1" = '{}' ]; then
		printf '%s' "$1"
		return
	fi
	rest=$1 quoted=
	while :; do
		case $rest in
		*\'*)
			quoted="$quoted${rest%%\'*}'\\''"
			rest=${rest#*\'}
			;;
		*) break ;;
		esac
	done
	printf "'%s'" "$quoted$rest"
}

# printable MAX prints $2 as printable ASCII (anything else becomes ?),
# cut to MAX characters: what /proc holds is chosen by whoever runs the
# process, and is printed here to a root terminal.
printable() {
	shown=$(printf '%s' "$2" | LC_ALL=C tr -c ' -~' '?')
	if [ "${#shown}" -gt "$1" ]; then
		shown="$(printf '%s' "$shown" | head -c "$1")..."
	fi
	printf '%s' "$shown"
}

# valid_unit tells whether $1 is a service's name in systemd's grammar (the
# characters of unit names, without the \ of escapes, bounded as systemd
# bounds them, not starting like an option).
valid_unit() {
	[ "${#1}" -le 256 ] || return 1
	case $1 in
	[!A-Za-z0-9:_]* | *[!A-Za-z0-9:_.@-]*) return 1 ;;
	?*.service) return 0 ;;
	esac
	return 1
}

# prop NAME PROPS prints property NAME from systemctl show's output PROPS.
prop() { printf '%s\n' "$2" | sed -n "s/^$1=//p"; }

# unit_of CGROUP prints the service whose own cgroup is CGROUP, or nothing.
# The cgroup's name proves nothing: any user with a delegated subtree
# (every systemd user session has one) names its cgroups as they like, as a
# command line or after a real unit. So the name must be a unit systemd
# has loaded, and CGROUP that unit's own cgroup.
unit_of() {
	unit_name=${1##*/}
	valid_unit "$unit_name" || return 0
	props=$(systemctl show -p Id -p LoadState -p ControlGroup -- "$unit_name" 2>/dev/null) || return 0
	[ "$(prop Id "$props")" = "$unit_name" ] || return 0
	[ "$(prop LoadState "$props")" = loaded ] || return 0
	[ "$(prop ControlGroup "$props")" = "$1" ] || return 0
	printf '%s\n' "$unit_name"
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
			service_fix disable "$unit"
			service_fix mkdir "$ASIDE"
			service_fix mv "$f" "$ASIDE"
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
			case $pid in
			'' | *[!0-9]*) continue ;;
			esac
			comm=$(head -c 64 "/proc/$pid/comm" 2>/dev/null) || comm=gone
			comm=$(printable 32 "$comm")
			# The cgroup v2 path (one line: a cgroup's name has no
			# newline, the kernel refuses it).
			cgroup=$(head -c 8192 "/proc/$pid/cgroup" 2>/dev/null | sed -n 's/^0:://p') || cgroup=
			unit=""
			case $cgroup in
			*"$nl"*) ;;
			/*) unit=$(unit_of "$cgroup") ;;
			esac
			if [ -n "$unit" ]; then
				found "port $PORT is held by $comm (pid $pid) of $unit"
				service_fix disable "$unit"
			else
				found "port $PORT is held by $comm (pid $pid), not a systemd service: an unknown process in cgroup $(printable 200 "${cgroup:-?}")"
				service_fix kill "$pid"
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
	denied=$(printable 200 "$denied")
	STORE_FIX=$(fix_record setfacl "$STORE" "$USER_NAME") || exit 2
	if [ "$upgrade" = true ]; then
		# An upgrade or reinstall of this package is not held back
		# for old artifacts: the agent runs, and fails their deletes.
		# printf, not echo: dash's echo expands backslashes in $denied.
		printf '%s: warning: the artifact store %s has directories %s cannot write, starting with %s: deleting old artifacts there fails until you run: %s\n' \
			"$WHO" "$STORE" "$USER_NAME" "$denied" "$(each_fix words "$STORE_FIX")" >&2
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
case "$nl$SERVICE_FIX" in
*"${nl}mv "*) service_fix daemon-reload ;;
esac
check_store

case $mode in
take-over)
	if [ -z "$SERVICE_FIX" ]; then
		echo "$WHO: no upstream unit or process found to take over"
		exit 0
	fi
	each_fix run "$SERVICE_FIX" || exit 1
	exit 0
	;;
adopt-store)
	if [ -n "$STORE_FIX" ] && ! command -v setfacl >/dev/null 2>&1; then
		echo "$WHO: setfacl is missing: install the acl package (apt-get install acl, or dnf install acl)" >&2
		exit 1
	fi
	each_fix run "$STORE_FIX" || exit 1
	exit 0
	;;
esac

[ -n "$FOUND" ] || exit 0

{
	echo "$WHO: an upstream CubeTemplateCenter is in the way; nothing was changed:"
	printf '%s' "$FOUND"
	echo "To hand this machine over (docs/upstream.md, \"Migrating from upstream\"), run as root:"
	each_fix show "$SERVICE_FIX$STORE_FIX" | sed 's/^/    /'
	if [ -n "$STORE_FIX" ] && ! command -v setfacl >/dev/null 2>&1; then
		echo "  (setfacl comes with the acl package: apt-get install acl, or dnf install acl)"
	fi
	echo "then install again. Upstream's configuration stays where it is, its unit files in $ASIDE."
} >&2
exit 1
