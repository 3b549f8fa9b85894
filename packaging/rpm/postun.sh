#!/bin/sh
# %postun for cube-templatecenter ($1: 0 on erase, 1 or more on upgrade):
# reload systemd, and on upgrade restart a running agent, as
# %systemd_postun_with_restart does. The agent's graceful stop puts running
# builds back in its spool queue, so a restart loses no accepted job.
#
# rpm has no purge: an erase keeps the spool (/var/lib/cube-templatecenter),
# the cache, the user and a modified configuration (saved as .rpmsave); the
# artifact store is never touched. docs/operations.md lists what to delete
# for a full purge.

SERVICE=cube-sandbox-cube-templatecenter.service

if [ -d /run/systemd/system ]; then
	systemctl daemon-reload || :
	# %systemd_postun_with_restart
	if [ "$1" -ge 1 ] && ! systemctl try-restart "$SERVICE"; then
		echo "cube-templatecenter: could not restart $SERVICE; see: journalctl -u $SERVICE" >&2
	fi
fi
exit 0
