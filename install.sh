#!/usr/bin/env bash
# install.sh: one-click bare-metal install of CubeTemplateCenter under systemd.
#
# Installs the templatecenter binary, the socket and service units, the
# sysusers.d and tmpfiles.d entries, the configuration and the environment
# file; creates the user and directories, enables and starts the socket and
# waits for /health. A second run upgrades in place and keeps the
# configuration. See --help and docs/operations.md.
set -euo pipefail

PROG=install.sh
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

SERVICE=cube-sandbox-cube-templatecenter.service
SOCKET=cube-sandbox-cube-templatecenter.socket
BIN=/usr/local/bin/templatecenter
UNIT_DIR=/etc/systemd/system
SYSUSERS=/etc/sysusers.d/cube-templatecenter.conf
TMPFILES=/etc/tmpfiles.d/cube-templatecenter.conf
MAN=/usr/local/share/man/man8/templatecenter.8
SHARE_DIR=/usr/local/share/cube-templatecenter
RULES=$SHARE_DIR/prometheus/cube-templatecenter-rules.yml
DASHBOARD=$SHARE_DIR/grafana/cube-templatecenter.json
CONF_DIR=/etc/cube-templatecenter
CONF=$CONF_DIR/conf.yaml
ENV_FILE=$CONF_DIR/templatecenter.env
STATE_DIR=/var/lib/cube-templatecenter
CACHE_DIR=/var/cache/cube-templatecenter
STORE_DIR=/data/CubeMaster/storage
USER_NAME=cube-templatecenter
ONE_CLICK_ENV=/usr/local/services/cubetoolbox/.one-click.env
HEALTH_TIMEOUT=60

usage() {
	cat <<EOF
Usage: $PROG [OPTIONS]
       $PROG --uninstall [--purge] [--dry-run]

Install CubeTemplateCenter as a socket-activated systemd service, or upgrade
an existing install in place (the configuration is kept). ISA-L
(libisal.so.2, for faster gzip inflate) is installed with apt-get or dnf
when missing; the agent runs without it if that fails.

Options:
  --binary PATH         install this templatecenter binary (default: build
                        one from this checkout with go, else use bin/templatecenter)
  --master-addr URL     CubeMaster's base URL (CUBE_MASTER_ADDR)
  --token-file PATH     read the secret shared with CubeMaster
                        (CUBE_TEMPLATE_CALLBACK_TOKEN) from the first line
                        of PATH, or from standard input with "-"; never
                        from the command line, where ps and shell history
                        would show it
  --one-click-env PATH  one-click environment file to take the address and
                        token from when not given (default: $ONE_CLICK_ENV)
  --no-start            install and enable, but start nothing
  --take-over           an upstream TemplateCenter is installed: stop and
                        disable its units and move their files to
                        /var/backups/cube-templatecenter-upstream (its
                        configuration is left where it is), then install
  --adopt-store         the artifact store exists and the agent's user
                        cannot write all of it (an upstream install's
                        root-owned store): grant the user access with an
                        ACL entry on each directory (setfacl, package acl);
                        owners and modes stay as they are
  --uninstall           stop, disable and remove the agent; keeps the
                        artifact store, the configuration and the state
  --purge               with --uninstall: also delete the configuration, the
                        state (the job spool) and the cache; never the
                        artifact store
  --dry-run             print what would be done and change nothing
  -h, --help            this text

Environment:
  DESTDIR=DIR           stage the files under DIR: no root needed, no user,
                        no directories, nothing enabled or started

Without --take-over and --adopt-store an upstream install in the way stops
the install before anything is changed, with the commands to run
(docs/upstream.md, "Migrating from upstream").

Files: $BIN, $UNIT_DIR/{$SOCKET,$SERVICE},
$SYSUSERS, $TMPFILES, $CONF, $ENV_FILE; examples for Prometheus
and Grafana: $RULES, $DASHBOARD.
EOF
}

die() {
	echo "$PROG: error: $*" >&2
	exit 1
}

note() { echo "$PROG: $*"; }

DID=()
# act DESCRIPTION COMMAND...: run COMMAND (or only print it with --dry-run)
# and remember DESCRIPTION for the summary.
act() {
	local what=$1
	shift
	if $DRY_RUN; then
		echo "would: $what"
		return 0
	fi
	echo "+ $what"
	"$@"
	DID+=("$what")
}

binary=""
master_addr=""
token=""
token_file=""
one_click_env=$ONE_CLICK_ENV
mode=install
purge=false
DRY_RUN=false
start=true
take_over=false
adopt_store=false
DESTDIR=${DESTDIR:-}

while [ $# -gt 0 ]; do
	case $1 in
	--binary) [ $# -ge 2 ] || die "--binary needs a path"; binary=$2; shift 2 ;;
	--binary=*) binary=${1#*=}; shift ;;
	--master-addr) [ $# -ge 2 ] || die "--master-addr needs a URL"; master_addr=$2; shift 2 ;;
	--master-addr=*) master_addr=${1#*=}; shift ;;
	--token | --token=*) die "--token is not accepted: a token on the command line shows in ps and shell history; use --token-file FILE, or --token-file - to read it from standard input" ;;
	--token-file) [ $# -ge 2 ] || die "--token-file needs a path (or - for standard input)"; token_file=$2; shift 2 ;;
	--token-file=*) token_file=${1#*=}; shift ;;
	--one-click-env) [ $# -ge 2 ] || die "--one-click-env needs a path"; one_click_env=$2; shift 2 ;;
	--one-click-env=*) one_click_env=${1#*=}; shift ;;
	--no-start) start=false; shift ;;
	--take-over) take_over=true; shift ;;
	--adopt-store) adopt_store=true; shift ;;
	--uninstall) mode=uninstall; shift ;;
	--purge) purge=true; shift ;;
	--dry-run) DRY_RUN=true; shift ;;
	-h | --help) usage; exit 0 ;;
	*) usage >&2; die "unknown option: $1" ;;
	esac
done

# read_token prints the first line of a token file ("-": standard input)
# without its line ending.
read_token() {
	local line=""
	if [ "$1" = - ]; then
		IFS= read -r line || [ -n "$line" ] || die "no token on standard input"
	else
		[ -r "$1" ] || die "--token-file: cannot read $1"
		IFS= read -r line <"$1" || [ -n "$line" ] || die "--token-file: $1 is empty"
	fi
	line=${line%$'\r'}
	[ -n "$line" ] || die "--token-file: the token is empty"
	printf '%s' "$line"
}
if [ -n "$token_file" ]; then
	token=$(read_token "$token_file") || exit 1
fi

if $purge && [ "$mode" != uninstall ]; then
	die "--purge only goes with --uninstall"
fi
if [ -n "$master_addr" ] && ! [[ $master_addr =~ ^https?://[^/]+ ]]; then
	die "--master-addr must be an http:// or https:// URL, got: $master_addr"
fi
if [ -n "$DESTDIR" ]; then
	DESTDIR=$(mkdir -p "$DESTDIR" && cd "$DESTDIR" && pwd)
	start=false
fi
D=$DESTDIR

# --- checks -----------------------------------------------------------------

check_system() {
	if [ -n "$D" ]; then
		return 0
	fi
	if [ "$(id -u)" -ne 0 ]; then
		die "must be run as root (or with DESTDIR=DIR to stage the files)"
	fi
	local pid1
	pid1=$(cat /proc/1/comm 2>/dev/null || echo unknown)
	if [ "$pid1" != systemd ]; then
		die "systemd is not running as PID 1 here (PID 1 is \"$pid1\"): the agent runs as a systemd service; use DESTDIR=DIR to stage the files instead"
	fi
	local tool
	for tool in systemctl systemd-sysusers systemd-tmpfiles install sed; do
		command -v "$tool" >/dev/null 2>&1 || die "missing prerequisite: $tool"
	done
	# The package and this script install to different places; one owner only.
	if dpkg-query -W -f='${Status}' cube-templatecenter 2>/dev/null | grep -q ' installed$'; then
		die "the cube-templatecenter package is installed: manage it with apt/dpkg instead of $PROG"
	fi
	if command -v rpm >/dev/null 2>&1 && rpm -q cube-templatecenter >/dev/null 2>&1; then
		die "the cube-templatecenter package is installed: manage it with rpm/dnf instead of $PROG"
	fi
}

# find_binary sets $binary: --binary, else a fresh build of this checkout,
# else bin/templatecenter.
find_binary() {
	local f
	for f in "$SRC/systemd/$SERVICE" "$SRC/systemd/$SOCKET" "$SRC/systemd/cube-templatecenter.sysusers" \
		"$SRC/systemd/cube-templatecenter.tmpfiles" "$SRC/packaging/etc/conf.yaml" "$SRC/packaging/upstream-check.sh" \
		"$SRC/packaging/etc/templatecenter.env" "$SRC/packaging/templatecenter.8" \
		"$SRC/packaging/prometheus/cube-templatecenter-rules.yml" "$SRC/packaging/grafana/cube-templatecenter.json"; do
		[ -f "$f" ] || die "missing file in the checkout: $f"
	done
	if [ -n "$binary" ]; then
		[ -f "$binary" ] || die "binary not found: $binary"
	elif [ -f "$SRC/go.mod" ] && command -v go >/dev/null 2>&1; then
		command -v gcc >/dev/null 2>&1 || command -v cc >/dev/null 2>&1 ||
			die "missing prerequisite: a C compiler (gcc) to build templatecenter (its SQLite driver uses cgo); or pass --binary PATH"
		if $DRY_RUN; then
			echo "would: build templatecenter from $SRC with go"
			binary="$SRC/bin/templatecenter"
			return 0
		fi
		local version
		version=$(cd "$SRC" && git describe --tags --always --dirty 2>/dev/null || echo dev)
		BUILD_DIR=$(mktemp -d)
		trap 'rm -rf "$BUILD_DIR"' EXIT
		echo "+ build templatecenter $version from $SRC"
		(cd "$SRC" && CGO_ENABLED=1 go build -trimpath -ldflags "-X main.Version=$version" \
			-o "$BUILD_DIR/templatecenter" ./cmd/templatecenter) || die "go build failed"
		binary=$BUILD_DIR/templatecenter
	elif [ -x "$SRC/bin/templatecenter" ]; then
		binary=$SRC/bin/templatecenter
	else
		die "no binary to install: pass --binary PATH, or install Go (and gcc) to build it from this checkout"
	fi
	[ -x "$binary" ] || die "binary is not executable: $binary"
	"$binary" version >/dev/null 2>&1 || die "$binary does not run on this machine (\`$binary version\` failed)"
}

# --- ISA-L ------------------------------------------------------------------

has_isal() {
	{ ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | grep -q '^[[:space:]]*libisal\.so\.2 '
}

# install_isal installs ISA-L's shared library (libisal.so.2) with apt-get
# or dnf: gzip layers then inflate 2-2.4x faster. The agent loads it at run
# time and runs without it, so failing here is a note, never an error.
install_isal() {
	[ -z "$D" ] || return 0
	if has_isal; then
		return 0
	fi
	local cmd=()
	if command -v apt-get >/dev/null 2>&1; then
		cmd=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libisal2)
	elif command -v dnf >/dev/null 2>&1; then
		cmd=(dnf install -y -q isa-l)
	else
		note "ISA-L (libisal.so.2) is not installed and there is no apt-get or dnf: gzip layers inflate with the built-in, slower inflater"
		return 0
	fi
	if $DRY_RUN; then
		echo "would: install ISA-L for faster gzip inflate (${cmd[*]})"
		return 0
	fi
	echo "+ install ISA-L for faster gzip inflate: ${cmd[*]}"
	if "${cmd[@]}" && has_isal; then
		DID+=("install ISA-L (libisal.so.2)")
	else
		note "could not install ISA-L (libisal.so.2): the agent runs without it, inflating gzip layers more slowly; install libisal2 (apt) or isa-l (dnf) later and restart it"
	fi
}

# --- environment file -------------------------------------------------------

# env_value FILE NAME...: the last value assigned to the first NAME set in
# FILE (KEY=value lines, optional "export", optional quotes); the file is
# read, never sourced.
env_value() {
	local file=$1 name line v
	shift
	[ -r "$file" ] || return 0
	for name in "$@"; do
		line=$(grep -E "^[[:space:]]*(export[[:space:]]+)?$name=" "$file" | tail -n 1 || true)
		[ -n "$line" ] || continue
		v=${line#*=}
		v=${v%$'\r'}
		if [[ $v == \"*\" ]]; then
			v=${v:1:${#v}-2}
			v=$(printf '%s' "$v" | sed -e 's/\\\([\\"$`]\)/\1/g')
		elif [[ $v == \'*\' ]]; then
			v=${v:1:${#v}-2}
		fi
		if [ -n "$v" ]; then
			printf '%s' "$v"
			return 0
		fi
	done
}

# quote VALUE: VALUE in double quotes, as systemd's EnvironmentFile= reads it.
quote() {
	printf '"%s"' "$(printf '%s' "$1" | sed -e 's/[\\"$`]/\\&/g')"
}

# set_env FILE NAME VALUE: replace NAME's assignment (or its commented-out
# placeholder) in FILE, or append one.
set_env() {
	local file=$1 name=$2 value tmp
	value=$(quote "$3")
	tmp=$(mktemp "$file.XXXXXX")
	# ENVIRON, not -v: awk would interpret backslashes in a -v value.
	TC_NAME=$name TC_LINE="$name=$value" awk '
		BEGIN { name = ENVIRON["TC_NAME"]; line = ENVIRON["TC_LINE"] }
		!done && ($0 ~ "^[[:space:]]*(export[[:space:]]+)?" name "=" || $0 ~ "^#" name "=") { print line; done = 1; next }
		$0 ~ "^[[:space:]]*(export[[:space:]]+)?" name "=" { next }
		{ print }
		END { if (!done) print line }
	' "$file" >"$tmp"
	chmod 0600 "$tmp"
	mv -f "$tmp" "$file"
}

write_env_file() {
	local dst=$D$ENV_FILE
	if [ ! -f "$dst" ]; then
		install -m 0600 "$SRC/packaging/etc/templatecenter.env" "$dst"
	fi
	if [ -n "$master_addr" ]; then
		set_env "$dst" CUBE_MASTER_ADDR "$master_addr"
	fi
	if [ -n "$token" ]; then
		set_env "$dst" CUBE_TEMPLATE_CALLBACK_TOKEN "$token"
	fi
	chmod 0600 "$dst"
}

# --- an upstream install -----------------------------------------------------

# upstream_check UPGRADE: packaging/upstream-check.sh (the packages' preinst)
# finds upstream's units, a process of its on the port and a store the
# agent cannot write. Without --take-over/--adopt-store it refuses with the
# commands to run; with them it runs those commands, then checks again.
upstream_check() {
	[ -z "$D" ] || return 0
	local check=(env TC_CHECK_WHO="$PROG" sh "$SRC/packaging/upstream-check.sh")
	local phase=install
	$1 && phase=upgrade
	if $DRY_RUN; then
		check=(env TC_CHECK_CREATE_USER=0 "${check[@]}")
	fi
	if "${check[@]}" "$phase"; then
		return 0
	fi
	if ! $take_over && ! $adopt_store; then
		die "an upstream install is in the way (above); run those commands, or rerun $PROG with --take-over (units and port) and --adopt-store (the store)"
	fi
	if $DRY_RUN; then
		$take_over && echo "would: take over from upstream (stop, disable and set aside its units)"
		$adopt_store && echo "would: grant $USER_NAME access to $STORE_DIR (ACL entries; owners and modes unchanged)"
		return 0
	fi
	if $take_over; then
		act "take over from upstream: stop and disable its units, set their files aside in /var/backups/cube-templatecenter-upstream" \
			"${check[@]}" take-over || die "taking over from upstream failed"
	fi
	if $adopt_store; then
		act "grant $USER_NAME access to $STORE_DIR (an ACL entry on each directory; owners and modes unchanged)" \
			"${check[@]}" adopt-store || die "granting access to $STORE_DIR failed"
	fi
	"${check[@]}" "$phase" || die "an upstream install is still in the way (above)"
}

# create_store creates the artifact store, owned by the agent, only where it
# is missing: an existing one keeps its owner and mode (--adopt-store).
create_store() {
	[ -e "$STORE_DIR" ] || install -d -m 0755 -o "$USER_NAME" -g "$USER_NAME" "$STORE_DIR"
}

# --- install ------------------------------------------------------------------

# secure_config makes conf.yaml 0640 root:$USER_NAME, also when an older
# install left it 0644; a group other than root was the administrator's
# choice and stays.
secure_config() {
	if [ "$(stat -c %g "$CONF")" = 0 ]; then
		chgrp "$USER_NAME" "$CONF"
	fi
	chmod g-w,o-rwx "$CONF"
}

install_file() { # MODE SRC DST: atomic replace
	local mode=$1 src=$2 dst=$D$3
	install -d -m 0755 "$(dirname "$dst")"
	install -m "$mode" "$src" "$dst.new"
	mv -f "$dst.new" "$dst"
}

install_unit() { # NAME
	local dst=$D$UNIT_DIR/$1
	install -d -m 0755 "$(dirname "$dst")"
	# Every Exec line that runs the agent (ExecStart=, ExecStartPre=,
	# ExecReload=) runs the installed binary.
	sed "s#^\(Exec[A-Za-z]*=\)/usr/bin/templatecenter #\1$BIN #" "$SRC/systemd/$1" >"$dst.new"
	chmod 0644 "$dst.new"
	mv -f "$dst.new" "$dst"
}

health_addr() {
	local listen host port
	listen=$(systemctl show --property=Listen --value "$SOCKET" | head -n 1)
	listen=${listen%% *}
	[ -n "$listen" ] || listen=127.0.0.1:8090
	port=${listen##*:}
	host=${listen%:*}
	case $host in
	0.0.0.0 | "") host=127.0.0.1 ;;
	"[::]") host="[::1]" ;;
	esac
	printf '%s:%s' "$host" "$port"
}

health_once() { # ADDR
	if command -v curl >/dev/null 2>&1; then
		curl -fsS --max-time 5 "http://$1/health"
	else
		local host=${1%:*} port=${1##*:} reply
		host=${host#[}
		host=${host%]}
		# shellcheck disable=SC2016 # $0 and $1 expand in the inner bash
		reply=$(timeout 5 bash -c 'exec 3<>"/dev/tcp/$0/$1" && printf "GET /health HTTP/1.0\r\nHost: %s\r\n\r\n" "$0" >&3 && cat <&3' "$host" "$port") || return 1
		[[ $reply == "HTTP/1."?" 200"* ]] || return 1
		printf '%s' "${reply##*$'\r\n\r\n'}"
	fi
}

wait_health() {
	local addr deadline body
	addr=$(health_addr)
	deadline=$((SECONDS + HEALTH_TIMEOUT))
	while :; do
		if body=$(health_once "$addr" 2>/dev/null); then
			echo "+ health: http://$addr/health answered: $body"
			DID+=("checked http://$addr/health")
			return 0
		fi
		if [ $SECONDS -ge $deadline ]; then
			systemctl --no-pager status "$SERVICE" >&2 || true
			die "http://$addr/health did not answer within ${HEALTH_TIMEOUT}s; see: journalctl -u $SERVICE"
		fi
		sleep 1
	done
}

do_install() {
	find_binary
	local upgrade=false was_active=false
	# Upstream's unit has the same name as ours: only ours counts.
	if [ -e "$D$BIN" ] || grep -q '^ExecStart=.*/templatecenter serve' "$D$UNIT_DIR/$SERVICE" 2>/dev/null; then
		upgrade=true
	fi
	if [ -z "$D" ] && systemctl --quiet is-active "$SERVICE" 2>/dev/null; then
		was_active=true
	fi
	upstream_check "$upgrade"
	if [ -z "$D" ] && $was_active && ! grep -q '^ExecStart=.*/templatecenter serve' "$UNIT_DIR/$SERVICE" 2>/dev/null; then
		# The service that ran was upstream's, now taken over.
		was_active=false
	fi

	# The address and token: flags, else the existing environment file keeps
	# its own, else the one-click environment file.
	if [ ! -f "$D$ENV_FILE" ] && [ -r "$one_click_env" ]; then
		if [ -z "$master_addr" ]; then
			master_addr=$(env_value "$one_click_env" CUBE_MASTER_ADDR CUBE_TEMPLATE_CENTER_MASTER_ENDPOINT CUBE_MASTER_ENDPOINT)
		fi
		if [ -z "$token" ]; then
			token=$(env_value "$one_click_env" CUBE_TEMPLATE_CALLBACK_TOKEN CUBE_TC_CALLBACK_TOKEN)
		fi
		note "taking CUBE_MASTER_ADDR and CUBE_TEMPLATE_CALLBACK_TOKEN from $one_click_env"
	fi

	install_isal
	act "install $binary as $D$BIN" install_file 0755 "$binary" "$BIN"
	act "install $D$UNIT_DIR/$SOCKET" install_unit "$SOCKET"
	act "install $D$UNIT_DIR/$SERVICE (ExecStart=$BIN serve)" install_unit "$SERVICE"
	act "install $D$SYSUSERS" install_file 0644 "$SRC/systemd/cube-templatecenter.sysusers" "$SYSUSERS"
	act "install $D$TMPFILES" install_file 0644 "$SRC/systemd/cube-templatecenter.tmpfiles" "$TMPFILES"
	act "install $D$MAN" install_file 0644 "$SRC/packaging/templatecenter.8" "$MAN"
	act "install the example alert rules $D$RULES" install_file 0644 "$SRC/packaging/prometheus/cube-templatecenter-rules.yml" "$RULES"
	act "install the example dashboard $D$DASHBOARD" install_file 0644 "$SRC/packaging/grafana/cube-templatecenter.json" "$DASHBOARD"
	act "create $D$CONF_DIR" install -d -m 0755 "$D$CONF_DIR"
	if [ -f "$D$CONF" ]; then
		note "keeping the existing $D$CONF"
	else
		act "install the default $D$CONF" install -m 0640 "$SRC/packaging/etc/conf.yaml" "$D$CONF"
	fi
	local env_what="write $D$ENV_FILE"
	if [ -f "$D$ENV_FILE" ]; then
		env_what="keep $D$ENV_FILE"
		if [ -n "$master_addr$token" ]; then
			env_what="update $D$ENV_FILE"
		fi
	fi
	[ -n "$master_addr" ] && env_what="$env_what (CUBE_MASTER_ADDR=$master_addr)"
	[ -n "$token" ] && env_what="$env_what (CUBE_TEMPLATE_CALLBACK_TOKEN set)"
	act "$env_what" write_env_file

	if [ -n "$D" ]; then
		summary "staged under $D (no user, directories or units were created or enabled)"
		return 0
	fi
	act "create the user $USER_NAME" systemd-sysusers "$SYSUSERS"
	act "let only root and the group $USER_NAME read $CONF (it may hold passwords)" secure_config
	act "create $STATE_DIR and $CACHE_DIR" systemd-tmpfiles --create "$TMPFILES"
	if [ -e "$STORE_DIR" ]; then
		note "keeping the existing $STORE_DIR ($(stat -c '%U:%G %a' "$STORE_DIR"))"
	else
		act "create $STORE_DIR" create_store
	fi
	act "reload systemd" systemctl daemon-reload
	act "enable $SOCKET and $SERVICE" systemctl --quiet enable "$SOCKET" "$SERVICE"
	if ! $start; then
		summary "installed; nothing started (--no-start): systemctl start $SOCKET"
		return 0
	fi
	if $was_active; then
		# A graceful stop puts running builds back in the spool's queue.
		act "restart $SERVICE (upgrade; queued jobs are kept)" systemctl restart "$SERVICE"
	fi
	act "start $SOCKET" systemctl start "$SOCKET"
	if $DRY_RUN; then
		echo "would: wait for /health (the first connection starts the service)"
		summary ""
		return 0
	fi
	wait_health
	if $upgrade; then
		summary "upgraded in place to $("$BIN" version | head -n1)"
	else
		summary "installed $("$BIN" version | head -n1)"
	fi
}

# --- uninstall --------------------------------------------------------------

do_uninstall() {
	if [ -z "$D" ]; then
		if systemctl cat "$SERVICE" >/dev/null 2>&1 || systemctl cat "$SOCKET" >/dev/null 2>&1; then
			act "stop and disable $SOCKET and $SERVICE" systemctl --quiet disable --now "$SOCKET" "$SERVICE"
		fi
	fi
	local f
	for f in "$UNIT_DIR/$SOCKET" "$UNIT_DIR/$SERVICE" "$BIN" "$SYSUSERS" "$TMPFILES" "$MAN" "$RULES" "$DASHBOARD"; do
		if [ -e "$D$f" ]; then
			act "remove $D$f" rm -f "$D$f"
		fi
	done
	for f in "$SHARE_DIR/prometheus" "$SHARE_DIR/grafana" "$SHARE_DIR"; do
		if [ -d "$D$f" ] && [ -z "$(ls -A "$D$f")" ]; then
			act "remove $D$f" rmdir "$D$f"
		fi
	done
	if [ -z "$D" ]; then
		act "reload systemd" systemctl daemon-reload
		systemctl reset-failed "$SERVICE" "$SOCKET" >/dev/null 2>&1 || true
	fi
	if $purge; then
		for f in "$CONF_DIR" "$STATE_DIR" "$CACHE_DIR"; do
			if [ -e "$D$f" ]; then
				act "delete $D$f" rm -rf "$D$f"
			fi
		done
		summary "uninstalled and purged; kept the artifact store $STORE_DIR and the user $USER_NAME"
	else
		summary "uninstalled; kept the artifact store $STORE_DIR, the configuration $CONF_DIR, the state $STATE_DIR (queued jobs, undelivered reports) and the user $USER_NAME (--purge deletes all but the store and the user)"
	fi
}

summary() {
	$DRY_RUN && { echo "dry run: nothing was changed"; return 0; }
	echo
	echo "$PROG: $1 (${#DID[@]} steps, each shown with + above)"
	if [ "$mode" = install ] && [ -z "$D" ]; then
		echo "status:   systemctl status $SERVICE"
		echo "logs:     journalctl -u $SERVICE"
		echo "config:   $CONF (systemctl reload $SERVICE applies it)"
		echo "jobs:     $BIN jobs"
	fi
}

check_system
if [ "$mode" = uninstall ]; then
	do_uninstall
else
	do_install
fi
