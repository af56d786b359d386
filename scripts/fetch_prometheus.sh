#!/usr/bin/env bash
# Prometheus and promtool for the /metrics tests, from Debian's `prometheus` package, cached outside the clone
# as build_llama_server.sh caches llama-server. The two binaries need only libc, so the package is unpacked,
# not installed: no root needed, and no prometheus daemon started by the package's unit.
# Prints the folder that holds both (its only output on stdout). Later runs reuse the cached copy.
set -euo pipefail
cache="${BOARD_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/board}/prometheus"
bin="$cache/bin"
if [ -x "$bin/prometheus" ] && [ -x "$bin/promtool" ]; then echo "$bin"; exit 0; fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
download() { (cd "$work" && apt-get download prometheus) >&2; }
if ! download; then
    if [ "$(id -u)" != 0 ]; then
        echo "can't download Debian's prometheus package; as root run 'apt-get update' once, then try again" >&2
        exit 1
    fi
    apt-get update >&2 && download  # a fresh machine has no package lists yet
fi
dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
mkdir -p "$cache"
rm -rf "$bin.tmp" && mkdir "$bin.tmp"
cp "$work/root/usr/bin/prometheus" "$work/root/usr/bin/promtool" "$bin.tmp/"
rm -rf "$bin" && mv "$bin.tmp" "$bin"
"$bin/promtool" --version >&2
echo "$bin"
