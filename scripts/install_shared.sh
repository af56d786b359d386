#!/bin/sh
# Install board on a shared server: the steps of "Install on a shared server" in docs/service.md,
# one for one. Run it as root from a checkout of this repository.
#
#   sudo scripts/install_shared.sh
#
# Settings (environment variables; the defaults are those of docs/service.md):
#   PREFIX             prepended to every path it writes, e.g. a temporary directory in tests (default: none)
#   PYTHON             the interpreter for the venv (default: python3)
#   BOARD_SOURCE       what to pip install (default: this checkout)
#   BOARD_GROUP        the Unix group of board users (default: board)
#   BOARD_ADMIN_GROUP  the Unix group of board admins (default: board-admin)
#   BOARD_MEMBERS      users to add to BOARD_GROUP, space-separated (default: none)
#
# Groups and the system user board are real even with PREFIX. With PREFIX the data directory,
# the runtime directory and the socket live under it too, and systemctl is not run: the tests
# start the agent the way the unit does (setpriv --reuid board ... board agent).
set -eu

PREFIX=${PREFIX:-}
PYTHON=${PYTHON:-python3}
BOARD_SOURCE=${BOARD_SOURCE:-$(cd "$(dirname "$0")/.." && pwd)}
GROUP=${BOARD_GROUP:-board}
ADMIN_GROUP=${BOARD_ADMIN_GROUP:-board-admin}
MEMBERS=${BOARD_MEMBERS:-}
SERVICE_USER=board  # the unit's User= and Group=
RUNNER_USER=board-llama  # board-runner.service's User= and Group=
RUNNER_UNIT=$PREFIX/etc/systemd/system/board-runner.service

VENV=$PREFIX/opt/board
BIN=$PREFIX/usr/local/bin
CONFIG=$PREFIX/etc/board/board.toml
DATA=$PREFIX/var/lib/board
RUN=$PREFIX/run/board
UNIT=$PREFIX/etc/systemd/system/board-agent.service

say() { printf 'install_shared: %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
    echo "install_shared: run this as root (sudo $0)" >&2
    exit 4
fi
umask 022

# 1. Groups: one for the people who book, one for admins; the system user the service runs as.
for g in "$GROUP" "$ADMIN_GROUP" "$SERVICE_USER"; do
    getent group "$g" >/dev/null || groupadd --system "$g"
done
if ! getent passwd "$SERVICE_USER" >/dev/null; then
    useradd --system --gid "$SERVICE_USER" --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin --comment "board service" "$SERVICE_USER"
fi
if [ "$GROUP" != "$SERVICE_USER" ]; then
    usermod -aG "$GROUP" "$SERVICE_USER"  # so that it may give its socket to the members' group
fi
for u in $MEMBERS; do
    usermod -aG "$GROUP" "$u"
done
say "groups $GROUP (users) and $ADMIN_GROUP (admins) and the system user $SERVICE_USER exist"

# 1b. The gateway's system user (board gateway, docs/gateway.md): no login, no capabilities, in the members' group
# only to reach the socket; the service gives it the servers' keys (gateway_state) and nobody else.
GATEWAY_USER=board-gateway
getent group "$GATEWAY_USER" >/dev/null || groupadd --system "$GATEWAY_USER"
if ! getent passwd "$GATEWAY_USER" >/dev/null; then
    useradd --system --gid "$GATEWAY_USER" --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin --comment "board gateway" "$GATEWAY_USER"
fi
usermod -aG "$GROUP" "$GATEWAY_USER"
say "the system user $GATEWAY_USER exists (for board-gateway.service)"

# 1c. The runner's system user (board runner starts the planned servers): no login, no capabilities; in the
# members' group only to reach the socket, where the service takes the runner's registration from this uid alone.
if ! getent group "$RUNNER_USER" >/dev/null; then
    groupadd --system "$RUNNER_USER"
fi
if ! getent passwd "$RUNNER_USER" >/dev/null; then
    useradd --system --gid "$RUNNER_USER" --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin --comment "board runner (planned servers)" "$RUNNER_USER"
fi
usermod -aG "$GROUP" "$RUNNER_USER"
say "the system user $RUNNER_USER (board runner) exists"

# 2. The program: a venv under /opt/board, with board linked onto PATH.
"$PYTHON" -m venv "$VENV"
# A current pip first: the console script an old one writes imports re, a few ms on every quick command (issue 37).
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade "$BOARD_SOURCE"
mkdir -p "$BIN"
ln -sfn "$VENV/bin/board" "$BIN/board"
say "installed $("$BIN/board" --version) in $VENV, linked as $BIN/board"

# 2b. Shell completion for everyone: bash-completion's folder for local installs and zsh's site-functions. Made by
# the installed board from its own parser, again at each install, so that new commands and flags are completed.
BASH_COMPLETIONS=$PREFIX/usr/local/share/bash-completion/completions
ZSH_FUNCTIONS=$PREFIX/usr/local/share/zsh/site-functions
install -d -m 0755 "$BASH_COMPLETIONS" "$ZSH_FUNCTIONS"
"$BIN/board" completion bash >"$BASH_COMPLETIONS/board"
"$BIN/board" completion zsh >"$ZSH_FUNCTIONS/_board"
chmod 0644 "$BASH_COMPLETIONS/board" "$ZSH_FUNCTIONS/_board"
say "completion for bash ($BASH_COMPLETIONS/board, with the bash-completion package) and zsh ($ZSH_FUNCTIONS/_board)"

# 3. The config file: root-owned, readable by all; an existing one is kept.
install -d -m 0755 "$PREFIX/etc/board"
if [ ! -e "$CONFIG" ]; then
    cat >"$CONFIG" <<EOF
# board's settings; see docs/configuration.md in board's source.
[storage]
db = "$DATA/board.db"

[service]
socket = "$RUN/board.sock"
group = "$GROUP"

[access]
admin_group = "$ADMIN_GROUP"
EOF
    chmod 0644 "$CONFIG"
    say "wrote $CONFIG"
else
    say "kept the existing $CONFIG"
fi

# 4. The service's own directory: only board may enter it; the service creates board.db (0600) there.
install -d -o "$SERVICE_USER" -g "$SERVICE_USER" -m 0700 "$DATA"
if [ -n "$PREFIX" ]; then
    # systemd makes /run/board (RuntimeDirectory=board) at each start; under a prefix, make it here.
    install -d -m 0755 "$PREFIX/run"
    install -d -o "$SERVICE_USER" -g "$SERVICE_USER" -m 0755 "$RUN"
fi
say "$DATA is $SERVICE_USER:$SERVICE_USER 0700"

# 5. The agent: the systemd unit shipped in the package, with this install's paths.
SHIPPED=$("$VENV/bin/python" -c 'import app, pathlib; print(pathlib.Path(app.__file__).parent / "systemd" / "board-agent.service")')
install -d -m 0755 "$(dirname "$UNIT")"
sed -e "s|/usr/local/bin/board|$BIN/board|g" \
    -e "s|/etc/board/board.toml|$CONFIG|g" \
    -e "s|/var/lib/board|$DATA|g" \
    -e "s|/run/board|$RUN|g" \
    "$SHIPPED" >"$UNIT"
chmod 0644 "$UNIT"
# 5b. The gateway's unit beside the agent's; not enabled here: enable it when the team should reach the servers.
sed -e "s|/usr/local/bin/board|$BIN/board|g" \
    -e "s|/etc/board/board.toml|$CONFIG|g" \
    -e "s|/var/lib/board|$DATA|g" \
    "$(dirname "$SHIPPED")/board-gateway.service" >"$(dirname "$UNIT")/board-gateway.service"
chmod 0644 "$(dirname "$UNIT")/board-gateway.service"

# 5c. The runner: its unit, with this install's paths.
SHIPPED_RUNNER=$(dirname "$SHIPPED")/board-runner.service
sed -e "s|/usr/local/bin/board|$BIN/board|g" \
    -e "s|/etc/board/board.toml|$CONFIG|g" \
    "$SHIPPED_RUNNER" >"$RUNNER_UNIT"
chmod 0644 "$RUNNER_UNIT"
if [ -z "$PREFIX" ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    systemctl enable --now board-runner.service
    say "board-runner.service enabled and started"
fi

# 5d. The power policy at boot (docs/health.md): where the config sets [power] limit_w or [power.cards],
# board-power.service runs board power apply as root once the driver is loaded. Enabled for the next boot, not run now.
POWER_UNIT=$PREFIX/etc/systemd/system/board-power.service
if BOARD_CONFIG=$CONFIG "$VENV/bin/python" -c 'from app.config import load_config
power = load_config().power
raise SystemExit(power.limit_w is None and not power.cards)' 2>/dev/null; then
    sed -e "s|/usr/local/bin/board|$BIN/board|g" \
        -e "s|/etc/board/board.toml|$CONFIG|g" \
        -e "s|/var/lib/board-power|$PREFIX/var/lib/board-power|g" \
        "$(dirname "$SHIPPED")/board-power.service" >"$POWER_UNIT"
    chmod 0644 "$POWER_UNIT"
    if [ -z "$PREFIX" ] && [ -d /run/systemd/system ]; then
        systemctl daemon-reload
        systemctl enable board-power.service
    else  # offline (an image, or PREFIX): only the symlink that WantedBy= asks for
        systemctl --root="${PREFIX:-/}" enable board-power.service
    fi
    say "board-power.service enabled: board power apply at each boot ([power] in $CONFIG)"
elif [ -e "$POWER_UNIT" ]; then  # the policy was taken out of the config: a unit left would fail at each boot
    if [ -z "$PREFIX" ] && [ -d /run/systemd/system ]; then
        systemctl disable board-power.service
    else
        systemctl --root="${PREFIX:-/}" disable board-power.service
    fi
    rm -f "$POWER_UNIT"
    say "no [power] limit_w in $CONFIG any more: board-power.service disabled and removed"
else
    say "no [power] limit_w in $CONFIG: board-power.service not installed (docs/health.md)"
fi

if [ -z "$PREFIX" ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    systemctl enable --now board-agent.service
    say "board-agent.service enabled and started"
    # 6. Check it all.
    BOARD_CONFIG=$CONFIG "$BIN/board" doctor
    systemctl status --no-pager board-agent.service
else
    say "wrote $UNIT (systemctl skipped: no systemd running here, or PREFIX is set);"
    say "start it as the unit does: BOARD_CONFIG=$CONFIG setpriv --reuid $SERVICE_USER --regid $SERVICE_USER --init-groups --inh-caps +kill --ambient-caps +kill $BIN/board agent"
    say "then check it: BOARD_CONFIG=$CONFIG $BIN/board doctor"
fi
say "done: add users with 'usermod -aG $GROUP NAME' (they log in again), admins with 'usermod -aG $ADMIN_GROUP NAME'"
