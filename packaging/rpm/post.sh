#!/bin/sh
# %post for cube-templatecenter ($1: 1 on install, 2 or more on upgrade):
# create the user and directories; on install enable the units and start the
# socket when systemd runs; on upgrade restart a running agent. The agent's
# graceful stop puts running builds back in its spool queue, so a restart
# loses no accepted job.

SERVICE=cube-sandbox-cube-templatecenter.service
SOCKET=cube-sandbox-cube-templatecenter.socket
STATE=/var/lib/cube-templatecenter

if command -v systemd-sysusers >/dev/null 2>&1; then
	systemd-sysusers cube-templatecenter.conf
elif ! getent passwd cube-templatecenter >/dev/null; then
	useradd --system --user-group --home-dir "$STATE" --no-create-home \
		--shell /sbin/nologin --comment "Cube Sandbox CubeTemplateCenter" cube-templatecenter
fi
if command -v systemd-tmpfiles >/dev/null 2>&1; then
	systemd-tmpfiles --create cube-templatecenter.conf
else
	install -d -m 0755 -o cube-templatecenter -g cube-templatecenter /data/CubeMaster/storage
	install -d -m 0750 -o cube-templatecenter -g cube-templatecenter "$STATE" /var/cache/cube-templatecenter
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

running=false
if [ -d /run/systemd/system ]; then
	running=true
	systemctl daemon-reload
fi
if [ "$1" -eq 1 ]; then
	if command -v systemctl >/dev/null 2>&1; then
		systemctl --quiet enable "$SOCKET" "$SERVICE" || true
	fi
	if $running && ! systemctl start "$SOCKET"; then
		echo "cube-templatecenter: could not start $SOCKET; see: systemctl status $SOCKET" >&2
	fi
elif $running && ! systemctl try-restart "$SERVICE"; then
	echo "cube-templatecenter: could not restart $SERVICE; see: journalctl -u $SERVICE" >&2
fi
exit 0
