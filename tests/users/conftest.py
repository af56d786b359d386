"""Real Unix users for the sharing tests: alice and bob (members), carol (admin), mallory (outsider).

CI runs as root, so these fixtures create the users and groups with useradd/groupadd, set up a
shared directory with `board init --group boardusers` and run the real `board` as each user
through setpriv (or runuser). Without root every test here is skipped with the reason.

The users and groups are left in place at the end (creating them is idempotent, and another
test session may be using them at the same time).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MEMBERS_GROUP = "boardusers"
ADMIN_GROUP = "boardadmins"
# name -> supplementary groups. The UIDs of alice, bob and carol match the simulated demo team's when free.
USERS = {
    "alice": (1001, [MEMBERS_GROUP]),
    "bob": (1002, [MEMBERS_GROUP]),
    "carol": (1003, [MEMBERS_GROUP, ADMIN_GROUP]),
    "mallory": (1066, []),
}
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


def _sh(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True)


def _ensure_group(name: str) -> None:
    try:
        grp.getgrnam(name)
    except KeyError:
        result = _sh("groupadd", name)
        if result.returncode not in (0, 9):  # 9: created meanwhile by someone else
            raise RuntimeError(f"groupadd {name}: {result.stderr.strip()}")


def _ensure_user(name: str, uid: int, groups: list[str]) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        taken = True
        try:
            pwd.getpwuid(uid)
        except KeyError:
            taken = False
        cmd = ["useradd", "--no-create-home", "--shell", "/bin/sh", "--user-group"]
        if not taken:
            cmd += ["--uid", str(uid)]
        result = _sh(*cmd, name)
        if result.returncode not in (0, 9):
            raise RuntimeError(f"useradd {name}: {result.stderr.strip()}")
    for group in (MEMBERS_GROUP, ADMIN_GROUP):
        members = grp.getgrnam(group).gr_mem
        if group in groups and name not in members:
            _sh("usermod", "-aG", group, name)
        elif group not in groups and name in members:
            _sh("gpasswd", "-d", name, group)


def _open_path_for_others(path: Path) -> list[Path]:
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


@pytest.fixture(scope="session")
def unix_users():
    """The four users and two groups exist, and every user can run this checkout with this Python."""
    for group in (MEMBERS_GROUP, ADMIN_GROUP):
        _ensure_group(group)
    for name, (uid, groups) in USERS.items():
        _ensure_user(name, uid, groups)
    # The interpreter may live under /root (pyenv): other users need to reach it, and the checkout.
    for target in (Path(os.path.realpath(sys.executable)), Path(sys.executable), REPO / "app"):
        _open_path_for_others(target)
    probe = _sh("setpriv", f"--reuid={pwd.getpwnam('mallory').pw_uid}", f"--regid={pwd.getpwnam('mallory').pw_gid}",
                "--init-groups", "--", sys.executable, "-c", "import app.cli")
    if probe.returncode != 0:
        pytest.skip(f"other users cannot run {sys.executable} on this checkout: {probe.stderr.strip()[-200:]}")
    return {name: pwd.getpwnam(name) for name in USERS}


@dataclass
class Board:
    """One shared board: a directory made by `board init`, a config naming the admin group, and a runner."""

    root: Path  # a 0755 scratch directory everyone can traverse
    dir: Path
    db: Path
    config: Path
    scenario: Path | None = None
    env: dict = field(default_factory=dict)
    program: list[str] | None = None  # default: this checkout's `python -m app`

    def cmd(self, user: str, *args: str, umask: int = 0o022, via: str = "setpriv",
            program: list[str] | None = None) -> list[str]:
        program = program or self.program or [sys.executable, "-m", "app"]
        inner = ["/bin/sh", "-c", f'umask {umask:03o}; exec "$@"', "sh", *program, *args]
        if user == "root":
            return inner
        entry = pwd.getpwnam(user)
        if via == "runuser":
            return [shutil.which("runuser") or "/usr/sbin/runuser", "--preserve-environment", "-u", user, "--", *inner]
        return [shutil.which("setpriv") or "/usr/bin/setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups", "--", *inner]

    def environ(self, user: str, env: dict | None = None) -> dict:
        base = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.root),
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "BOARD_CONFIG": str(self.config),
            "BOARD_SIMULATE": str(self.scenario) if self.scenario else "1",
            "XDG_STATE_HOME": str(self.root / "state"),
            "USER": user,
            "LOGNAME": user,
            "TZ": "UTC",
        }
        base.update(self.env)
        base.update(env or {})
        return {k: v for k, v in base.items() if v is not None}

    def run(self, user: str, *args: str, env: dict | None = None, umask: int = 0o022, via: str = "setpriv",
            program: list[str] | None = None, check: bool = False) -> subprocess.CompletedProcess:
        result = subprocess.run(
            self.cmd(user, *args, umask=umask, via=via, program=program), capture_output=True, text=True,
            env=self.environ(user, env), cwd=REPO, timeout=120,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"board {' '.join(args)} as {user} exited {result.returncode}: {result.stderr}")
        return result

    def json(self, user: str, *args: str, **kwargs):
        result = self.run(user, *args, "--json", check=True, **kwargs)
        return json.loads(result.stdout)

    def book(self, user: str, *args: str, **kwargs) -> dict:
        return self.json(user, "book", *args, **kwargs)


@pytest.fixture
def scratch(unix_users):
    """A directory under /tmp that every user can traverse (pytest's own tmp_path is 0700 root)."""
    root = Path(tempfile.mkdtemp(prefix="board-users-", dir="/tmp"))
    os.chmod(root, 0o755)
    (root / "state").mkdir(mode=0o1777)
    os.chmod(root / "state", 0o1777)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def write_config(path: Path, db: Path, admin_group: str = ADMIN_GROUP) -> Path:
    path.write_text(f'[storage]\ndb = "{db}"\n\n[access]\nadmin_group = "{admin_group}"\n')
    os.chmod(path, 0o644)
    return path


@pytest.fixture
def board(scratch) -> Board:
    """`board init --group boardusers --dir D` run as root, and a config with [storage] db and the admin group."""
    directory = scratch / "lib" / "board"
    db = directory / "board.db"
    config = write_config(scratch / "board.toml", db)
    shared = Board(root=scratch, dir=directory, db=db, config=config)
    result = shared.run("root", "init", "--group", MEMBERS_GROUP, "--dir", str(directory))
    assert result.returncode == 0, result.stderr
    return shared
