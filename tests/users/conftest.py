"""Real Unix users on a shared install: alice and bob (members), carol (admin), mallory (outsider).

The shared install is a service: `board agent` runs as the system user board, alone opens the
database (a 0700 directory, a 0600 file), and members talk to it over its socket. CI runs as
root, so these fixtures create the users and groups (tests/unix_users.py) and make a throwaway
shared install (tests/shared_install.py: the prefix as scripts/install_shared.sh lays it out, the
agent as the systemd unit runs it, the real `board` run as each user). Without root every test
here is skipped with the reason.

The users and groups are left in place at the end (creating them is idempotent, and another
test session may be using them at the same time).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from tests import shared_install
from tests.shared_install import SharedInstall, make_layout, scratch_dir
from tests.unix_users import ADMIN_GROUP, ensure_unix_users

TOOLS = ("useradd", "groupadd", "usermod", "gpasswd", "setpriv", "runuser")
# Fast enforcement, so that a job outliving its booking is stopped within the tests' patience.
FAST_ENFORCE = "[enforce]\ninterval_s = 0.5\ngrace_s = 2\n"


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    reason = None
    if os.geteuid() != 0:
        reason = "real-user tests need root (CI runs as root): they create users with useradd"
    elif missing := [t for t in TOOLS if shutil.which(t) is None]:
        reason = f"real-user tests need {', '.join(missing)} (apt-get install passwd util-linux)"
    for item in items:
        if reason and here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def unix_users():
    """The users and groups (tests.unix_users), created once per session."""
    return ensure_unix_users()


def config_text(prefix: Path, *, admin_group: str = ADMIN_GROUP, extra: str = "") -> str:
    """The service's config as the install script writes it, plus fast enforcement for the tests."""
    return shared_install.config_text(prefix, admin_group=admin_group, extra=FAST_ENFORCE + extra)


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
    root = scratch_dir("board-users-")
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def make_board(scratch):
    """A factory: make_board(extra_toml="", nofile=None) lays out the prefix, starts the agent as the unit does, and
    returns the SharedInstall."""
    made: list[SharedInstall] = []

    def make(extra: str = "", nofile: str | None = None, **agent_env) -> SharedInstall:
        prefix = scratch / "prefix"
        make_layout(prefix, config_text(prefix, extra=extra))
        shared = SharedInstall(root=scratch, prefix=prefix)
        made.append(shared)
        shared.start_agent(agent_env, nofile)
        return shared

    yield make
    for shared in made:
        shared.stop_agent()


@pytest.fixture
def board(make_board) -> SharedInstall:
    """The shared install with its agent running, members reaching it through BOARD_CONFIG=PREFIX/etc/board/board.toml."""
    return make_board()
