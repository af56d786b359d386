#!/bin/sh
# Run a command with every process's clock moved to DATE, to show the suite does not depend on the day:
#
#   sudo scripts/any_day.sh '2026-12-09 10:00' .venv/bin/python -m pytest -p no:randomly tests/integration
#
# libfaketime (Debian's faketime package) through a private /etc (a copy, in a mount namespace of the command's own):
# its ld.so.preload and faketimerc reach every process, also those a test starts with a clean environment (the
# agent under setpriv, `board` run as another user), and useradd there writes to the copy. The clock is moved by
# an offset, so it runs on and every process agrees. Root only (unshare, mount); never part of `make test`.
set -eu
[ $# -ge 2 ] || { echo "usage: $0 'YYYY-MM-DD HH:MM[:SS]' COMMAND..." >&2; exit 2; }
lib=$(ls /usr/lib/*/faketime/libfaketime.so.1 2>/dev/null | head -n 1)
[ -n "$lib" ] || { echo "$0: no libfaketime; apt-get install faketime" >&2; exit 2; }
offset=$(( $(date -u -d "$1" +%s) - $(date +%s) )) || { echo "$0: can't read the date '$1'" >&2; exit 2; }
shift
etc=$(mktemp -d /tmp/any-day-etc.XXXXXX)
trap 'rm -rf "$etc"' EXIT
cp -a /etc/. "$etc"/
echo "$lib" >"$etc/ld.so.preload"
echo "$( [ "$offset" -ge 0 ] && echo + )$offset" >"$etc/faketimerc"
unshare --mount sh -c 'mount --bind "$1" /etc && shift && exec "$@"' sh "$etc" "$@"
