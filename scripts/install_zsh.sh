#!/usr/bin/env bash
# zsh for the completion tests (tests/integration/test_completion.py runs the real shell), from Debian's package as
# install_postgresql.sh installs PostgreSQL. Without root and without zsh it says so and the zsh cases skip; the bash
# ones still run.
set -euo pipefail
if command -v zsh >/dev/null; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
    echo "zsh is not installed: the zsh completion tests skip (as root: apt-get install zsh)" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
install() { apt-get install -y --no-install-recommends zsh >&2; }
install || { apt-get update >&2 && install; }  # a fresh machine has no package lists yet
zsh --version >&2
