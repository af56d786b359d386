"""A throwaway shared install for the service benchmarks (not a benchmark itself).

tests/shared_install.py's, as the real-user tests make it, without pytest: makes sure the users
exist (the system user board, members alice and bob in the members' group), lays out a PREFIX
under /tmp the way scripts/install_shared.sh does, and starts `board agent` as the systemd unit
runs it, with the installed entry point and BOARD_SIMULATE=1 (the simulated 8-card fleet).
Root only. The agent is stopped and the scratch directory removed on the way out, whatever happens.

    with shared_install() as install:
        install.run("alice", "status", "--json", check=True)
        install.stats()  # the service's `stats` operation, asked as root
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# The install and the users as the tests make them.
from tests.shared_install import SharedInstall, config_text, make_layout, scratch_dir  # noqa: E402
from tests.unix_users import (  # noqa: E402
    MEMBERS_GROUP, SERVICE_USER, add_to_group, as_user, cannot_run_checkout, ensure_group, ensure_service_user, ensure_user,
    open_checkout_for_others,
)

__all__ = ["BIN", "BOARD", "MEMBERS_GROUP", "REPO", "SharedInstall", "as_user", "cpu_seconds", "require_root",
           "rss_kib", "shared_install"]

BIN = Path(sys.executable).parent
BOARD = BIN / "board"  # the installed entry point, as a member runs it
# install_shared.sh defaults the members' group to "board" (the service user's own group); the real-user tests use
# "boardusers" with the user board in it, and these benchmarks do the same (--group changes it).
MEMBERS = ("alice", "bob")  # under the uids useradd gives


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise SystemExit(f"{what} needs root: it creates users and runs the agent as the user {SERVICE_USER}"
                         " (sudo .venv/bin/python ...)")


def ensure_users(group: str = MEMBERS_GROUP, members: tuple[str, ...] = MEMBERS) -> None:
    """The system user board (in `group`, so it may give the socket to it), and the members in `group`."""
    if group != SERVICE_USER:
        ensure_group(group)
    ensure_service_user(group)
    for name in members:
        ensure_user(name)
        add_to_group(name, group)
    open_checkout_for_others()
    for name in (SERVICE_USER, *members):
        if problem := cannot_run_checkout(name):
            raise SystemExit(problem)


@contextmanager
def shared_install(*, group: str = MEMBERS_GROUP, extra_toml: str = "", agent_env: dict | None = None,
                   board: Path = BOARD) -> Iterator[SharedInstall]:
    """A shared install whose members are in `group`, `extra_toml` added to its config, its agent serving; `board` is
    the entry point it runs (another checkout's, to compare two versions in one run)."""
    require_root("a shared install")
    ensure_users(group)
    root = scratch_dir("board-bench-")
    install = SharedInstall(root=root, prefix=root / "prefix", program=[str(board)])
    try:
        make_layout(install.prefix, config_text(install.prefix, group=group, admin_group=None, extra=extra_toml))
        install.start_agent(agent_env)
        yield install
    finally:
        install.stop_agent()
        shutil.rmtree(root, ignore_errors=True)


def rss_kib(pid: int) -> int:
    """VmRSS of a process now, KiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pid: int, *, split: bool = False) -> float | tuple[float, float]:
    """User + system CPU of a process so far (from /proc/<pid>/stat); with `split`, (user, system)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    user, system = int(fields[11]) / os.sysconf("SC_CLK_TCK"), int(fields[12]) / os.sysconf("SC_CLK_TCK")
    return (user, system) if split else user + system


def release_together(children: list, what: str, timeout: float) -> tuple[list[dict], float]:
    """Children that each print "ready", wait for "go" on stdin and end with one JSON report line: wait until all
    are ready, release them at once, and gather the reports; returns them and the seconds from "go" to the last."""
    for child in children:
        if child.stdout.readline().strip() != "ready":
            child.wait()
            raise SystemExit(f"a {what} failed to start: {child.stderr.read().strip()[-800:]}")
    began = time.perf_counter()
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    reports = []
    for child in children:
        out, err = child.communicate(timeout=timeout)
        if child.returncode != 0:
            raise SystemExit(f"a {what} exited {child.returncode}: {err.strip()[-800:]}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports, time.perf_counter() - began
