"""A throwaway shared install for the service benchmarks (not a benchmark itself).

It does what tests/users/conftest.py does, without pytest: makes sure the users exist (the
system user board, members alice and bob in the members' group), lays out a PREFIX under /tmp
the way scripts/install_shared.sh does, and starts `board agent` exactly as the systemd unit
runs it, without systemd:

    umask 077; setpriv --reuid board --regid board --init-groups --inh-caps +kill --ambient-caps +kill board agent

with BOARD_CONFIG naming PREFIX/etc/board/board.toml ([storage] db in a 0700 directory owned
by board, [service] socket and group) and BOARD_SIMULATE=1 (the simulated 8-card fleet).
Root only. Use it as a context manager: the agent is stopped and the scratch directory removed
on the way out, whatever happens.

    with SharedInstall() as install:
        install.run("alice", "status", "--json")
        install.stats()  # the service's `stats` operation, asked as root
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests import agent_process  # noqa: E402 - the agent as the unit runs it, as the tests start it
from tests.unix_users import ensure_group, ensure_service_user, ensure_user, open_path_for_others  # noqa: E402

BIN = Path(sys.executable).parent
BOARD = BIN / "board"  # the installed entry point, as a member runs it
SETPRIV, SERVICE_USER = agent_process.SETPRIV, agent_process.SERVICE_USER
# The members' group. install_shared.sh defaults it to "board" (the service user's own group); the real-user
# tests use "boardusers" with the user board in it, and these benchmarks do the same (--group changes it).
MEMBERS_GROUP = "boardusers"
MEMBERS = {"alice": 1001, "bob": 1002}


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise SystemExit(f"{what} needs root: it creates users and runs the agent as the user {SERVICE_USER}"
                         " (sudo .venv/bin/python ...)")


def _ensure_member(name: str, group: str) -> None:
    if name not in grp.getgrnam(group).gr_mem and pwd.getpwnam(name).pw_gid != grp.getgrnam(group).gr_gid:
        subprocess.run(["usermod", "-aG", group, name], capture_output=True)


def ensure_users(group: str = MEMBERS_GROUP, members: dict[str, int] = MEMBERS) -> None:
    """The system user board (in `group`, so it may give the socket to it), and the members in `group`."""
    if group != SERVICE_USER:
        ensure_group(group)
    ensure_service_user(group)
    for name, uid in members.items():
        ensure_user(name, uid)
        _ensure_member(name, group)
    # Every directory above the interpreter and the checkout must be searchable by others (o+x, no listing).
    for target in (Path(os.path.realpath(sys.executable)), Path(sys.executable), REPO / "app"):
        open_path_for_others(target)
    for name in (SERVICE_USER, *members):
        probe = subprocess.run(as_user(name, [sys.executable, "-c", "import app.cli"]), capture_output=True, text=True)
        if probe.returncode != 0:
            raise SystemExit(f"{name} cannot run {sys.executable} on {REPO}: {probe.stderr.strip()[-300:]}")


def as_user(user: str | None, argv: list[str]) -> list[str]:
    """argv run as `user` (with that user's groups, as a login would give them); None: as we are."""
    if user is None:
        return argv
    entry = pwd.getpwnam(user)
    return [SETPRIV, f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups", "--", *argv]


def rss_kib(pid: int) -> int:
    """VmRSS of a process now, KiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (from /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class SharedInstall:
    """PREFIX under /tmp laid out as install_shared.sh does, and its agent started as the unit starts it."""

    def __init__(self, *, group: str = MEMBERS_GROUP, extra_toml: str = "", agent_env: dict | None = None) -> None:
        self.group, self.extra_toml, self.agent_env = group, extra_toml, agent_env or {}
        self.root: Path | None = None
        self.agent: subprocess.Popen | None = None

    # -- layout ---------------------------------------------------------------------------------

    @property
    def prefix(self) -> Path:
        return self.root / "prefix"

    @property
    def config(self) -> Path:
        return self.prefix / "etc/board/board.toml"

    @property
    def db(self) -> Path:
        return self.prefix / "var/lib/board/board.db"

    @property
    def socket(self) -> Path:
        return self.prefix / "run/board/board.sock"

    @property
    def agent_log(self) -> Path:
        return self.root / "agent.log"

    def __enter__(self) -> "SharedInstall":
        require_root("a shared install")
        ensure_users(self.group)
        self.root = Path(tempfile.mkdtemp(prefix="board-bench-", dir="/tmp"))
        try:
            os.chmod(self.root, 0o755)
            (self.root / "state").mkdir(mode=0o1777)
            os.chmod(self.root / "state", 0o1777)
            service = pwd.getpwnam(SERVICE_USER)
            for directory in ("etc/board", "var/lib", "run"):
                (self.prefix / directory).mkdir(parents=True, exist_ok=True, mode=0o755)
            for directory, mode in (("var/lib/board", 0o700), ("run/board", 0o755)):
                path = self.prefix / directory
                path.mkdir()
                os.chown(path, service.pw_uid, service.pw_gid)
                os.chmod(path, mode)
            self.config.write_text(
                f'[storage]\ndb = "{self.db}"\n\n[service]\nsocket = "{self.socket}"\ngroup = "{self.group}"\n\n'
                + self.extra_toml)
            os.chmod(self.config, 0o644)
            self.start_agent()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop_agent()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- the agent ------------------------------------------------------------------------------

    def start_agent(self) -> None:
        self.agent = agent_process.start([str(BOARD)], self.config, self.agent_log, self.agent_env)
        try:
            agent_process.wait_serving(self.agent, self.socket, self.agent_log)
        except AssertionError as error:
            raise SystemExit(str(error)) from None

    def stop_agent(self) -> None:
        agent_process.stop(self.agent)

    @property
    def agent_pid(self) -> int:
        """The agent's own pid (sh and setpriv exec into it, so it is the Popen's)."""
        return self.agent.pid

    def client(self):
        from app.client.socket import SocketClient

        return SocketClient(str(self.socket))

    def stats(self) -> dict:
        client = self.client()
        try:
            return client.call("stats")
        finally:
            client.close()

    # -- members --------------------------------------------------------------------------------

    def environ(self, user: str, **extra: str) -> dict[str, str]:
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(self.root), "LANG": "C.UTF-8",
                "BOARD_CONFIG": str(self.config), "XDG_STATE_HOME": str(self.root / "state"), "USER": user,
                "LOGNAME": user, "TZ": "UTC", **extra}

    def run(self, user: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """`board ARGS` as `user` (the installed entry point), to completion."""
        result = subprocess.run(as_user(user, [str(BOARD), *args]), capture_output=True, text=True,
                                env=self.environ(user), cwd=self.root)
        if check and result.returncode != 0:
            raise SystemExit(f"board {' '.join(args)} as {user} exited {result.returncode}: {result.stderr.strip()}")
        return result

    def db_rows(self, sql: str, *params) -> list[tuple]:
        """The service's database read directly, read-only, as root."""
        import sqlite3

        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()
