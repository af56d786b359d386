"""A throwaway shared install: the one way tests/users and bench/ make one. Plain Python, no pytest.

A PREFIX under a scratch directory in /tmp, laid out as scripts/install_shared.sh lays it out
(PREFIX/etc/board/board.toml, PREFIX/var/lib/board in a 0700 directory owned by board, PREFIX/run/board),
its agent started as the systemd unit runs it (tests/agent_process.py), and the real `board` run as each
user through setpriv (or runuser) with BOARD_CONFIG naming the prefix's config. The users come from
tests/unix_users.py. Root only.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests import agent_process
from tests.unix_users import ADMIN_GROUP, MEMBERS_GROUP, REPO, SERVICE_USER, as_user

PYTHON_APP = [sys.executable, "-m", "app"]  # this checkout, with this interpreter


def scratch_dir(prefix: str = "board-") -> Path:
    """A fresh directory under /tmp that every user can traverse (pytest's tmp_path is 0700 root), with a
    world-writable state/ for the users' XDG_STATE_HOME. The caller removes it."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(root, 0o755)
    (root / "state").mkdir()
    os.chmod(root / "state", 0o1777)
    return root


def config_text(prefix: Path, *, group: str = MEMBERS_GROUP, admin_group: str | None = ADMIN_GROUP,
                extra: str = "") -> str:
    """The service's config as the install script writes it ([access] only where `admin_group` is named)."""
    text = f'[storage]\ndb = "{prefix}/var/lib/board/board.db"\n\n[service]\nsocket = "{prefix}/run/board/board.sock"\n'
    text += f'group = "{group}"\n\n'
    if admin_group is not None:
        text += f'[access]\nadmin_group = "{admin_group}"\n\n'
    return text + extra


def make_layout(prefix: Path, config: str) -> Path:
    """What scripts/install_shared.sh lays out under PREFIX (less the venv), with `config`: the config's path."""
    service = pwd.getpwnam(SERVICE_USER)
    for directory in ("etc/board", "var/lib", "run"):
        (prefix / directory).mkdir(parents=True, exist_ok=True, mode=0o755)
    for directory, mode in (("var/lib/board", 0o700), ("run/board", 0o755)):
        path = prefix / directory
        path.mkdir(exist_ok=True)
        os.chown(path, service.pw_uid, service.pw_gid)
        os.chmod(path, mode)
    path = prefix / "etc/board/board.toml"
    path.write_text(config)
    os.chmod(path, 0o644)
    return path


def read_rows(db, sql: str, *params) -> list[tuple]:
    """Read the service's database directly, read-only, as root (never creating a file in its directory)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


@dataclass
class SharedInstall:
    """One shared install: a PREFIX laid out as the install script does, its agent, and a runner for users."""

    root: Path  # a scratch_dir(): the users' HOME and XDG_STATE_HOME, and the agent's log
    prefix: Path
    program: list[str] = field(default_factory=lambda: PYTHON_APP)  # how to run board, for the agent and users
    env: dict = field(default_factory=dict)  # added to every user's environment
    agent: subprocess.Popen | None = None

    @property
    def config(self) -> Path:
        return self.prefix / "etc/board/board.toml"

    @property
    def dir(self) -> Path:
        return self.prefix / "var/lib/board"

    @property
    def db(self) -> Path:
        return self.dir / "board.db"

    @property
    def socket(self) -> Path:
        return self.prefix / "run/board/board.sock"

    @property
    def agent_log(self) -> Path:
        return self.root / "agent.log"

    def home(self, user: str) -> Path:
        """A directory of the user's own, for what their jobs write."""
        path = self.root / "home" / user
        if not path.exists():
            path.mkdir(parents=True)
            entry = pwd.getpwnam(user)
            os.chown(path, entry.pw_uid, entry.pw_gid)
            os.chmod(path, 0o755)
        return path

    # -- the agent, as the unit runs it ---------------------------------------------------------------

    def start_agent(self, env: dict | None = None, nofile: str | None = None) -> subprocess.Popen:
        """`nofile` ("1024:1024"): the open-file limits the unit's LimitNOFILE= would give it."""
        self.agent = agent_process.start(self.program, self.config, self.agent_log, env, nofile)
        agent_process.wait_serving(self.agent, self.socket, self.agent_log)
        return self.agent

    def answers(self) -> bool:
        return agent_process.answers(self.socket)

    def stop_agent(self) -> None:
        agent_process.stop(self.agent)

    def agent_alive(self) -> bool:
        return self.agent is not None and self.agent.poll() is None and self.answers()

    @property
    def agent_pid(self) -> int:
        """The agent's own pid (sh and setpriv exec into it, so it is the Popen's)."""
        return self.agent.pid

    def client(self):
        """A SocketClient to the agent, as root (admin and member)."""
        from app.client.socket import SocketClient

        return SocketClient(str(self.socket))

    def stats(self) -> dict:
        """The service's `stats` operation, asked as root."""
        client = self.client()
        try:
            return client.call("stats")
        finally:
            client.close()

    # -- users ------------------------------------------------------------------------------------------

    def cmd(self, user: str, *args: str, umask: int = 0o022, via: str = "setpriv",
            program: list[str] | None = None) -> list[str]:
        inner = ["/bin/sh", "-c", f'umask {umask:03o}; exec "$@"', "sh", *(program or self.program), *args]
        if user == "root":
            return inner
        if via == "runuser":
            return [shutil.which("runuser") or "/usr/sbin/runuser", "--preserve-environment", "-u", user, "--", *inner]
        return as_user(user, inner)

    def environ(self, user: str, env: dict | None = None) -> dict:
        base = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.root),
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "BOARD_CONFIG": str(self.config),
            "XDG_STATE_HOME": str(self.root / "state"),
            "USER": user,
            "LOGNAME": user,
            "TZ": "UTC",
        }
        base.update(self.env)
        base.update(env or {})
        return {k: v for k, v in base.items() if v is not None}

    def run(self, user: str, *args: str, env: dict | None = None, umask: int = 0o022, via: str = "setpriv",
            program: list[str] | None = None, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
        result = subprocess.run(
            self.cmd(user, *args, umask=umask, via=via, program=program), capture_output=True, text=True,
            env=self.environ(user, env), cwd=REPO, timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"board {' '.join(args)} as {user} exited {result.returncode}: {result.stderr}")
        return result

    def spawn(self, user: str, *args: str, env: dict | None = None, program: list[str] | None = None,
              **popen) -> subprocess.Popen:
        return subprocess.Popen(self.cmd(user, *args, program=program), env=self.environ(user, env), cwd=REPO,
                                **popen)

    def json(self, user: str, *args: str, **kwargs):
        result = self.run(user, *args, "--json", check=True, **kwargs)
        return json.loads(result.stdout)

    def book(self, user: str, *args: str, **kwargs) -> dict:
        return self.json(user, "book", *args, **kwargs)

    def log(self, limit: int = 500) -> list[dict]:
        """The audit log, oldest first, as an admin (carol) sees it through the service."""
        return list(reversed(self.json("carol", "log", "--limit", str(limit))["events"]))

    def rows(self, sql: str, *params) -> list[tuple]:
        return read_rows(self.db, sql, *params)
