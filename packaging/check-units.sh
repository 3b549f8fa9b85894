#!/bin/sh
# Usage: packaging/check-units.sh BINARY MAX_EXPOSURE
# Verifies the units in systemd/ offline: `systemd-analyze verify` must print
# nothing, and `systemd-analyze security --offline=true` must rate the
# service at most MAX_EXPOSURE (e.g. 3.0). verify needs the Exec lines'
# binary to exist, so copies of the units point at BINARY.
set -eu

bin=$(readlink -f "$1")
# --threshold counts tenths of the exposure score.
threshold=$(awk -v max="$2" 'BEGIN { printf "%d", max * 10 + 0.5 }')
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for u in "$here"/systemd/*.service "$here"/systemd/*.socket; do
	sed -e "s#^\(Exec[A-Za-z]*=\)/usr/bin/templatecenter #\1$bin #" "$u" >"$tmp/$(basename "$u")"
done
cd "$tmp"
if ! out=$(systemd-analyze verify --man=no ./*.socket ./*.service 2>&1) || [ -n "$out" ]; then
	echo "systemd-analyze verify failed or printed findings:"
	echo "$out"
	exit 1
fi
echo "systemd-analyze verify: no findings"
for s in ./*.service; do
	if ! out=$(systemd-analyze security --offline=true --threshold="$threshold" "$s" 2>&1); then
		echo "$out"
		echo "$s: exposure above $2"
		exit 1
	fi
	echo "$out" | tail -n 1
done
