#!/bin/sh
# %post for cube-templatecenter ($1: 1 on install, 2 or more on upgrade):
# create the user and directories; on install apply the presets, as
# %systemd_post does (the package's preset enables both units; a preset of
# the administrator's in /etc/systemd/system-preset/ wins), and start the
# socket when systemd runs and the preset enabled it. The upgrade's restart
# is %postun's, as with %systemd_postun_with_restart. nfpm expands no rpm
# macros: this is their expansion, written out. %pre
# (packaging/upstream-check.sh) has already refused to install over an
# upstream TemplateCenter.

SERVICE=cube-sandbox-cube-templatecenter.service
SOCKET=cube-sandbox-cube-templatecenter.socket
STATE=/var/lib/cube-templatecenter
STORE=/data/CubeMaster/storage

if command -v systemd-sysusers >/dev/null 2>&1; then
	systemd-sysusers cube-templatecenter.conf
elif ! getent passwd cube-templatecenter >/dev/null; then
	useradd --system --user-group --home-dir "$STATE" --no-create-home \
		--shell /sbin/nologin --comment "Cube Sandbox CubeTemplateCenter" cube-templatecenter
fi
if command -v systemd-tmpfiles >/dev/null 2>&1; then
	systemd-tmpfiles --create cube-templatecenter.conf
else
	install -d -m 0750 -o cube-templatecenter -g cube-templatecenter "$STATE" /var/cache/cube-templatecenter
fi
# The store is created only where it is missing: an existing one is
# CubeMaster's (perhaps written by upstream as root) and keeps its owner and
# mode.
if [ ! -e "$STORE" ]; then
	install -d -m 0755 -o cube-templatecenter -g cube-templatecenter "$STORE"
fi

conf=/etc/cube-templatecenter/conf.yaml
# conf.yaml may hold passwords: readable by root and the service's group
# only (0640 root:cube-templatecenter), also when an older package left it
# 0644. A group other than root was chosen by the administrator: kept.
if [ -f "$conf" ]; then
	if [ "$(stat -c %g "$conf")" = 0 ]; then
		chgrp cube-templatecenter "$conf"
	fi
	chmod g-w,o-rwx "$conf"
fi

if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || :
fi
if [ "$1" -eq 1 ] && command -v systemctl >/dev/null 2>&1; then
	# %systemd_post
	systemctl --no-reload preset "$SOCKET" "$SERVICE" >/dev/null 2>&1 || :
	if [ -d /run/systemd/system ] && systemctl --quiet is-enabled "$SOCKET" &&
		! systemctl start "$SOCKET"; then
		echo "cube-templatecenter: could not start $SOCKET; see: systemctl status $SOCKET" >&2
		exit 1
	fi
fi
exit 0
