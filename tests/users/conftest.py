"""Real Unix users on a shared install: alice and bob (members), carol (admin), mallory (outsider).

The shared install is a service: `board agent` runs as the system user board, alone opens the
database (a 0700 directory, a 0600 file), and members talk to it over its socket. CI runs as
root, so these fixtures create the users and groups with useradd/groupadd, lay out a PREFIX the
way scripts/install_shared.sh does (PREFIX/etc/board/board.toml, PREFIX/var/lib/board,
PREFIX/run/board/board.sock), start the agent exactly as the systemd unit does, without systemd:

    umask 077; setpriv --reuid board --regid board --init-groups --inh-caps +kill --ambient-caps +kill board agent

and run the real `board` as each user through setpriv (or runuser) with BOARD_CONFIG naming the
prefix's config. Without root every test here is skipped with the reason.

The users and groups are left in place at the end (creating them is idempotent, and another
test session may be using them at the same time).
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
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import agent_process
from tests.agent_process import SETPRIV
from tests.unix_users import ADMIN_GROUP, MEMBERS_GROUP, REPO, SERVICE_USER, ensure_unix_users

TOOLS = ("useradd", "groupadd", "usermod", "gpasswd", "setpriv", "runuser")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    reason = None
    if os.geteuid() != 0:
        reason = "real-user tests need root (CI runs as root): they create users with useradd"
    elif missing := [t for t in TOOLS if shutil.which(t) is None]:
        reason = f"real-user tests need {', '.join(missing)} (apt-get install passwd util-linux)"
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.users)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def unix_users():
    """The users and groups (tests.unix_users), created once per session."""
    return ensure_unix_users()


def config_text(prefix: Path, *, admin_group: str = ADMIN_GROUP, extra: str = "") -> str:
    """The service's config as the install script writes it, plus fast enforcement for the tests."""
    return (f'[storage]\ndb = "{prefix}/var/lib/board/board.db"\n\n'
            f'[service]\nsocket = "{prefix}/run/board/board.sock"\ngroup = "{MEMBERS_GROUP}"\n\n'
            f'[access]\nadmin_group = "{admin_group}"\n\n'
            f'[enforce]\ninterval_s = 0.5\ngrace_s = 2\n' + extra)


def write_config(path: Path, db: Path, admin_group: str = ADMIN_GROUP, extra: str = "") -> Path:
    """The service's config at `path` for the install whose database is `db` (PREFIX/var/lib/board/board.db).

    The agent reads its config when it starts: after a change, board.stop_agent(); board.start_agent().
    """
    path.write_text(config_text(Path(db).parents[3], admin_group=admin_group, extra=extra))
    os.chmod(path, 0o644)
    return path


def make_layout(prefix: Path, config: str | None = None) -> Path:
    """What scripts/install_shared.sh lays out under PREFIX (less the venv): the config path."""
    service = pwd.getpwnam(SERVICE_USER)
    for directory in ("etc/board", "var/lib", "run"):
        (prefix / directory).mkdir(parents=True, exist_ok=True, mode=0o755)
    for directory in ("var/lib/board", "run/board"):
        path = prefix / directory
        path.mkdir(exist_ok=True)
        os.chown(path, service.pw_uid, service.pw_gid)
        os.chmod(path, 0o700 if directory.startswith("var") else 0o755)
    path = prefix / "etc/board/board.toml"
    path.write_text(config if config is not None else config_text(prefix))
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
class Board:
    """One shared install: a PREFIX laid out as the install script does, its agent, and a runner for users."""

    root: Path  # a 0755 scratch directory everyone can traverse
    prefix: Path
    program: list[str] | None = None  # default: this checkout's `python -m app`
    env: dict = field(default_factory=dict)
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
        self.agent = agent_process.start(self.program or [sys.executable, "-m", "app"], self.config,
                                         self.agent_log, env, nofile)
        agent_process.wait_serving(self.agent, self.socket, self.agent_log)
        return self.agent

    def answers(self) -> bool:
        return agent_process.answers(self.socket)

    def stop_agent(self) -> None:
        agent_process.stop(self.agent)

    def agent_alive(self) -> bool:
        return self.agent is not None and self.agent.poll() is None and self.answers()

    # -- users ------------------------------------------------------------------------------------------

    def cmd(self, user: str, *args: str, umask: int = 0o022, via: str = "setpriv",
            program: list[str] | None = None) -> list[str]:
        program = program or self.program or [sys.executable, "-m", "app"]
        inner = ["/bin/sh", "-c", f'umask {umask:03o}; exec "$@"', "sh", *program, *args]
        if user == "root":
            return inner
        entry = pwd.getpwnam(user)
        if via == "runuser":
            return [shutil.which("runuser") or "/usr/sbin/runuser", "--preserve-environment", "-u", user, "--", *inner]
        return [SETPRIV, f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups", "--", *inner]

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
        """The audit log, oldest first, as an admin sees it through the service."""
        return list(reversed(self.json("carol", "log", "--limit", str(limit))["events"]))

    def rows(self, sql: str, *params) -> list[tuple]:
        return read_rows(self.db, sql, *params)


def wait_for(predicate, timeout: float = 15.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


@pytest.fixture
def scratch(unix_users):
    """A directory under /tmp that every user can traverse (pytest's own tmp_path is 0700 root)."""
    root = Path(tempfile.mkdtemp(prefix="board-users-", dir="/tmp"))
    os.chmod(root, 0o755)
    (root / "state").mkdir(mode=0o1777)
    os.chmod(root / "state", 0o1777)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def make_board(scratch):
    """A factory: make_board(extra_toml="", nofile=None) lays out the prefix, starts the agent as the unit does, and
    returns the Board."""
    made: list[Board] = []

    def make(extra: str = "", nofile: str | None = None, **agent_env) -> Board:
        prefix = scratch / "prefix"
        make_layout(prefix, config_text(prefix, extra=extra))
        shared = Board(root=scratch, prefix=prefix)
        made.append(shared)
        shared.start_agent(agent_env, nofile)
        return shared

    yield make
    for shared in made:
        shared.stop_agent()


@pytest.fixture
def board(make_board) -> Board:
    """The shared install with its agent running, members reaching it through BOARD_CONFIG=PREFIX/etc/board/board.toml."""
    return make_board()
