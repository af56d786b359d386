"""scripts/install_shared.sh follows the README's "Install on a shared server" as root, and the result works.

It installs into a temporary PREFIX (a venv in PREFIX/opt/board, board linked in PREFIX/usr/local/bin,
the config in PREFIX/etc/board, the database in PREFIX/var/lib/board, the unit in
PREFIX/etc/systemd/system), with the real groups boardusers and boardadmins. Then alice books
through the installed `board`, bob sees it, carol (admin) cancels it, mallory is turned away.
"""

from __future__ import annotations

import grp
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.users.conftest import ADMIN_GROUP, MEMBERS_GROUP, REPO, Board

pytestmark = pytest.mark.users  # real Unix users; skipped with the reason when not root

SECTION = REPO / "README.md"
IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                ".hypothesis", "*.db", "*.db-wal", "*.db-shm", "tests", "screenshots")


@pytest.fixture(scope="module")
def installed(tmp_path_factory, unix_users):
    """Run the script once for the module: (prefix, its output)."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="board-install-", dir="/tmp"))
    os.chmod(root, 0o755)
    source = root / "src"
    shutil.copytree(REPO, source, ignore=IGNORE)  # pip builds in the tree: not in the shared checkout
    prefix = root / "prefix"
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "PREFIX": str(prefix),
        "PYTHON": os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
        "BOARD_SOURCE": str(source),
        "BOARD_GROUP": MEMBERS_GROUP,
        "BOARD_ADMIN_GROUP": ADMIN_GROUP,
    }
    result = subprocess.run(["sh", str(REPO / "scripts" / "install_shared.sh")], capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    yield prefix, result.stdout
    shutil.rmtree(root, ignore_errors=True)


def as_installed(prefix: Path, scratch: Path) -> Board:
    return Board(root=scratch, dir=prefix / "var/lib/board", db=prefix / "var/lib/board/board.db",
                 config=prefix / "etc/board/board.toml", program=[str(prefix / "usr/local/bin/board")])


def run(board: Board, user: str, *args: str, **kwargs):
    return board.run(user, *args, **kwargs)


def test_the_layout_is_what_the_section_says(installed):
    prefix, output = installed
    link = prefix / "usr/local/bin/board"
    assert link.is_symlink() and os.readlink(link) == str(prefix / "opt/board/bin/board")
    data = prefix / "var/lib/board"
    st = os.stat(data)
    assert stat.S_IMODE(st.st_mode) == 0o2770 and grp.getgrgid(st.st_gid).gr_name == MEMBERS_GROUP
    st = os.stat(data / "board.db")
    assert stat.S_IMODE(st.st_mode) == 0o660 and grp.getgrgid(st.st_gid).gr_name == MEMBERS_GROUP
    config = (prefix / "etc/board/board.toml").read_text()
    assert f'db = "{data}/board.db"' in config and f'admin_group = "{ADMIN_GROUP}"' in config
    assert stat.S_IMODE(os.stat(prefix / "etc/board/board.toml").st_mode) == 0o644
    assert not re.search(r"^FIX", output, re.M) and "audit chain intact" in output


def test_the_unit_is_shipped_in_the_package_and_installed_with_this_prefix(installed):
    prefix, _ = installed
    shipped = list((prefix / "opt/board/lib").glob("python3*/site-packages/app/systemd/board-agent.service"))
    assert len(shipped) == 1, "the unit is not in the installed package"
    unit = (prefix / "etc/systemd/system/board-agent.service").read_text()
    assert re.search(rf"^ExecStart={re.escape(str(prefix))}/usr/local/bin/board agent$", unit, re.M), unit
    assert f"Environment=BOARD_CONFIG={prefix}/etc/board/board.toml" in unit
    assert f"ReadWritePaths={prefix}/var/lib/board" in unit
    assert "WantedBy=multi-user.target" in unit
    if shutil.which("systemd-analyze"):
        verify = subprocess.run(["systemd-analyze", "verify", str(prefix / "etc/systemd/system/board-agent.service")],
                                capture_output=True, text=True)
        assert verify.returncode == 0, verify.stderr


def test_the_agent_command_the_unit_runs_exists(installed, scratch):
    prefix, _ = installed
    board = as_installed(prefix, scratch)
    result = run(board, "root", "agent", "--help")
    assert result.returncode == 0 and "agent" in result.stdout, result.stderr


def test_members_use_the_installed_board(installed, scratch):
    prefix, _ = installed
    board = as_installed(prefix, scratch)
    mine = board.json("alice", "book", "2", "--for", "1h", "--note", "installed")
    assert mine["user"] == "alice"
    seen = board.json("bob", "list")["bookings"]
    assert [(b["id"], b["user"]) for b in seen] == [(mine["id"], "alice")]
    refused = run(board, "bob", "cancel", str(mine["id"]))
    assert refused.returncode == 4
    assert board.json("carol", "cancel", str(mine["id"]))["id"] == mine["id"]
    outsider = run(board, "mallory", "list")
    assert outsider.returncode == 4 and len(outsider.stderr.splitlines()) == 1
    assert f"ask an admin to add you to group {MEMBERS_GROUP}" in outsider.stderr
    doctor = run(board, "bob", "doctor", "--group", MEMBERS_GROUP)
    assert doctor.returncode == 0, doctor.stdout


def test_the_section_and_the_script_agree():
    """Each command of the README section appears in the script, so they cannot drift apart silently."""
    section = SECTION.read_text()
    script = (REPO / "scripts" / "install_shared.sh").read_text()
    block = section.split("<!-- install:begin -->", 1)[1].split("<!-- install:end -->", 1)[0]
    for needle in ("python3 -m venv /opt/board", "pip install", "ln -sfn /opt/board/bin/board /usr/local/bin/board",
                   "groupadd --system board", "groupadd --system board-admin", "board init --group board",
                   "/etc/board/board.toml", "systemctl enable --now board-agent", "board doctor --group board",
                   "usermod -aG board"):
        assert needle in block, f"the README section lost {needle!r}"
    for step in ("groupadd --system", "-m venv", "pip install", "ln -sfn", "init --group", "systemctl enable --now",
                 "doctor --group", "board-agent.service", "admin_group"):
        assert step in script, f"the script lost {step!r}"
