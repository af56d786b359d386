"""The real Unix users the real-user tests act as: alice and bob (members), carol (admin), mallory (outsider),
and the service's system user board. Created with useradd/groupadd (root only: CI runs as root), idempotently,
and left in place: another test session may be using them at the same time.

tests/users uses them through its `unix_users` fixture; other suites that need real users (tests/llama's
servers through the service) call ensure_unix_users() themselves rather than depend on tests/users having run.
"""

from __future__ import annotations

import fcntl
import grp
import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests import agent_process
from tests.agent_process import SETPRIV

REPO = Path(__file__).resolve().parents[1]
MEMBERS_GROUP = "boardusers"
ADMIN_GROUP = "boardadmins"
SERVICE_USER = agent_process.SERVICE_USER  # the unit's User= and Group=
# name -> supplementary groups. Each uid is whatever useradd gives (the machine may hold others): a test takes it
# from pwd, and the agent's simulated processes carry it (tests/agent_process.py: team_fleet).
USERS = {
    "alice": [MEMBERS_GROUP],
    "bob": [MEMBERS_GROUP],
    "carol": [MEMBERS_GROUP, ADMIN_GROUP],
    "mallory": [],
}

# useradd, groupadd, usermod and gpasswd refuse (rather than wait) while another holds /etc/passwd's or /etc/group's
# lock, and parallel test workers make the same users at once: one such command at a time, across processes.
USERS_LOCK = Path("/tmp/board-tests-unix-users.lock")


def _sh(*cmd: str) -> subprocess.CompletedProcess:
    with open(USERS_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return subprocess.run(cmd, capture_output=True, text=True)


def ensure_group(name: str, system: bool = False) -> None:
    try:
        grp.getgrnam(name)
    except KeyError:
        result = _sh("groupadd", *(["--system"] if system else []), name)
        if result.returncode not in (0, 9):  # 9: created meanwhile by someone else
            raise RuntimeError(f"groupadd {name}: {result.stderr.strip()}")


def ensure_user(name: str) -> None:
    """The user, with a group of its own and no home, under the uid useradd chooses."""
    try:
        pwd.getpwnam(name)
    except KeyError:
        result = _sh("useradd", "--no-create-home", "--shell", "/bin/sh", "--user-group", name)
        if result.returncode not in (0, 9):
            raise RuntimeError(f"useradd {name}: {result.stderr.strip()}")


def _set_groups(name: str, groups: list[str]) -> None:
    """`name` in exactly those of the members' and admins' groups that `groups` lists."""
    for group in (MEMBERS_GROUP, ADMIN_GROUP):
        members = grp.getgrnam(group).gr_mem
        if group in groups:
            add_to_group(name, group)
        elif name in members:
            _sh("gpasswd", "-d", name, group)


def ensure_service_user(group: str = MEMBERS_GROUP) -> None:
    """The system user board, in `group` (the members') so that it may give them its socket."""
    ensure_system_user(SERVICE_USER, group)


GATEWAY_USER = "board-gateway"  # board gateway's unit's User= (scripts/install_shared.sh)
RUNNER_USER = "board-llama"  # `board runner`'s system user (scripts/install_shared.sh)


def ensure_system_user(name: str, group: str = MEMBERS_GROUP) -> pwd.struct_passwd:
    """A system user (no login, no home) as the install script makes board, board-gateway and board-llama, in
    `group` (the members') so that it may reach the socket."""
    ensure_group(name, system=True)
    try:
        pwd.getpwnam(name)
    except KeyError:
        result = _sh("useradd", "--system", "--gid", name, "--no-create-home", "--home-dir", "/nonexistent",
                     "--shell", "/usr/sbin/nologin", name)
        if result.returncode not in (0, 9):
            raise RuntimeError(f"useradd {name}: {result.stderr.strip()}")
    add_to_group(name, group)
    return pwd.getpwnam(name)


def add_to_group(name: str, group: str) -> None:
    """`name` in `group` (a supplementary group, unless it is already the user's own)."""
    if name not in grp.getgrnam(group).gr_mem and pwd.getpwnam(name).pw_gid != grp.getgrnam(group).gr_gid:
        _sh("usermod", "-aG", group, name)


def open_path_for_others(path: Path) -> list[Path]:
    """Let other users traverse every directory above `path` (o+x only: no listing); returns what changed.

    Not undone at the end: another session's real-user processes (or bench/bench_load.py) may be
    running this interpreter at that moment, and taking the search bit away mid-run breaks their imports.
    """
    changed = []
    for directory in [*reversed(path.parents)]:
        mode = stat.S_IMODE(directory.stat().st_mode)
        if not mode & stat.S_IXOTH:
            os.chmod(directory, mode | stat.S_IXOTH)
            changed.append(directory)
    return changed


def ensure_unix_users() -> dict[str, pwd.struct_passwd]:
    """The four users, two groups and the service user exist, and every one can run this checkout with this Python."""
    for group in (MEMBERS_GROUP, ADMIN_GROUP):
        ensure_group(group)
    for name, groups in USERS.items():
        ensure_user(name)
        _set_groups(name, groups)
    ensure_service_user()
    open_checkout_for_others()  # the interpreter may live under /root (pyenv)
    for name in ("mallory", SERVICE_USER):
        if problem := cannot_run_checkout(name):
            pytest.skip(problem)
    return {name: pwd.getpwnam(name) for name in [*USERS, SERVICE_USER]}


def open_checkout_for_others() -> None:
    """Every directory above this interpreter and this checkout searchable by others (o+x, no listing)."""
    for target in (Path(os.path.realpath(sys.executable)), Path(sys.executable), REPO / "app"):
        open_path_for_others(target)


def cannot_run_checkout(user: str) -> str | None:
    """Why `user` cannot run this interpreter on this checkout, or None when it can."""
    probe = subprocess.run(as_user(user, [sys.executable, "-c", "import app.cli"]), capture_output=True, text=True)
    return None if probe.returncode == 0 else f"{user} cannot run {sys.executable} on {REPO}: {probe.stderr.strip()[-300:]}"


def as_user(user: str, argv: list[str]) -> list[str]:
    """argv run as `user`, with that user's groups as a login would give them."""
    entry = pwd.getpwnam(user)
    return [SETPRIV, f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups", "--", *argv]
