#!/bin/sh
# %postun for cube-templatecenter ($1: 0 on erase). rpm has no purge: an
# erase keeps the spool (/var/lib/cube-templatecenter), the cache, the user
# and a modified configuration (saved as .rpmsave); the artifact store is
# never touched. docs/operations.md lists what to delete for a full purge.

if [ "$1" -eq 0 ] && [ -d /run/systemd/system ]; then
	systemctl daemon-reload || true
fi
exit 0
