#!/bin/sh
# %preun for cube-templatecenter ($1: 0 on erase, 1 or more on upgrade): on
# erase stop and disable the units, as %systemd_preun does. On upgrade
# nothing stops here: %postun restarts the agent.

SERVICE=cube-sandbox-cube-templatecenter.service
SOCKET=cube-sandbox-cube-templatecenter.socket

if [ "$1" -eq 0 ] && command -v systemctl >/dev/null 2>&1; then
	# %systemd_preun
	systemctl --no-reload disable "$SOCKET" "$SERVICE" >/dev/null 2>&1 || :
	if [ -d /run/systemd/system ]; then
		systemctl stop "$SOCKET" "$SERVICE" || :
	fi
fi
exit 0
