#!/bin/sh
# %preun for cube-templatecenter ($1: 0 on erase, 1 or more on upgrade): on
# erase stop and disable the units. On upgrade nothing stops here: the new
# package's %post restarts the agent.

SERVICE=cube-sandbox-cube-templatecenter.service
SOCKET=cube-sandbox-cube-templatecenter.socket

if [ "$1" -eq 0 ]; then
	if [ -d /run/systemd/system ]; then
		systemctl stop "$SOCKET" "$SERVICE" || true
	fi
	if command -v systemctl >/dev/null 2>&1; then
		systemctl --quiet disable "$SOCKET" "$SERVICE" || true
	fi
fi
exit 0
