#!/usr/bin/env bash
# PostgreSQL for the `postgresql` test tier (tests/postgres.py starts a throwaway socket-only cluster from its
# binaries, as the user postgres). Installs Debian's `postgresql` package when initdb is missing, as make test builds
# llama-server: installed rather than unpacked, since initdb needs the system user postgres the package makes.
# The package's own cluster is not wanted: none is created. Prints the binaries' folder (its only output on stdout).
set -euo pipefail
newest() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }
bin="$(newest)"
if [ -n "$bin" ] && [ -x "$bin/initdb" ]; then echo "$bin"; exit 0; fi
if [ "$(id -u)" != 0 ]; then
    echo "PostgreSQL is not installed; as root run scripts/install_postgresql.sh (or apt-get install postgresql)" >&2
    exit 1
fi
mkdir -p /etc/postgresql-common/createcluster.d
echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.d/board-tests.conf
export DEBIAN_FRONTEND=noninteractive
install() { apt-get install -y --no-install-recommends postgresql postgresql-contrib >&2; }
install || { apt-get update >&2 && install; }  # a fresh machine has no package lists yet
bin="$(newest)"
"$bin/initdb" --version >&2
echo "$bin"
