"""`board doctor` on a damaged or tampered directory: one FIX line each, no traceback, no fix that follows a link.

A member of the board group may write the board directory, so may plant a symlink where SQLite
keeps its files, hard-link a file in, or leave a file owned by someone outside the group. doctor
must name each, must not open the database through a planted link, and must never print a
chmod/chown/chgrp whose path is a symlink (those commands follow it): the fix is to remove it.
"""

from __future__ import annotations

import grp
import os
import re
from pathlib import Path

import pytest

from app.store import events
from app.store.db import connect, write
from app.store.setup import doctor, init_shared
from tests.conftest import run_board

GROUP = next((g.gr_name for g in grp.getgrall() if g.gr_name == "users"),
             next(g.gr_name for g in grp.getgrall() if g.gr_gid != 0))  # doctor flags group root
PAGE = 4096


@pytest.fixture
def board(tmp_path) -> Path:
    """A set-up board directory (init_shared) whose database has about a hundred pages of audit events."""
    db = tmp_path / "board" / "board.db"
    init_shared(db, GROUP)
    conn = connect(db)
    with write(conn):
        for n in range(200):
            events.record(conn, ts=n, uid=0, actor="root", action="note", booking_id=None, ok=True,
                          details={"pad": "y" * 1500})
    conn.close()
    return db


def fixes(db: Path, **kwargs) -> list[str]:
    return [line for ok, line in doctor(db, "root", group=GROUP, **kwargs) if not ok]


def commands_on_links(lines: list[str]) -> list[str]:
    """Every chmod/chown/chgrp in `lines` whose path is a symlink (or lies under one)."""
    bad = []
    for line in lines:
        for match in re.finditer(r"\b(chmod|chown|chgrp)\b((?:\s+-\S+)*)\s+\S+\s+(/\S+)", line):
            path = Path(match.group(3))
            if any(p.is_symlink() for p in (path, *path.parents)):
                bad.append(line)
    return bad


def test_a_healthy_board_has_nothing_to_fix(board):
    assert fixes(board) == []


def test_random_bytes_are_one_fix_line(board):
    board.write_bytes(os.urandom(board.stat().st_size))
    found = [line for line in fixes(board) if "database" in line]
    assert len(found) == 1 and "not a usable board database" in found[0], found


@pytest.mark.parametrize("first, count", [(1, 3), (20, 10)])
def test_overwritten_pages_are_one_fix_line(board, first, count):
    data = bytearray(board.read_bytes())
    data[first * PAGE:(first + count) * PAGE] = os.urandom(count * PAGE)
    board.write_bytes(bytes(data))
    found = fixes(board)
    assert len(found) == 1, found
    assert "damaged" in found[0] or "integrity" in found[0]
    assert "restore" in found[0] and "\n" not in found[0]


def test_the_cli_reports_a_damaged_database_without_a_traceback(board):
    data = bytearray(board.read_bytes())
    data[PAGE:4 * PAGE] = os.urandom(3 * PAGE)
    board.write_bytes(bytes(data))
    result = run_board("doctor", "--group", GROUP, env={"BOARD_DB": str(board), "BOARD_SIMULATE": "1"})
    assert "Traceback" not in result.stdout + result.stderr
    assert result.returncode == 1 and result.stderr == ""
    about_the_file = [line for line in result.stdout.splitlines() if line.startswith("FIX") and str(board) in line]
    assert len(about_the_file) == 1 and "damaged" in about_the_file[0], result.stdout


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm", "-journal"])
def test_a_planted_symlink_is_named_and_not_followed(board, suffix):
    victim = board.parent.parent / "victim"
    victim.write_bytes(b"precious")
    victim.chmod(0o600)
    link = Path(f"{board}{suffix}")
    if suffix == "":
        os.rename(board, board.parent.parent / "real.db")
    os.symlink(victim, link)
    found = fixes(board)
    assert any(f"remove the symlink {link}" in line for line in found), found
    assert commands_on_links(found) == []
    assert victim.read_bytes() == b"precious" and (victim.stat().st_mode & 0o777) == 0o600


def test_a_symlinked_directory_is_named_and_no_fix_follows_it(board, tmp_path):
    real = board.parent
    real.chmod(0o755)  # something for doctor to want to chmod
    link = tmp_path / "linked"
    os.symlink(real, link)
    found = fixes(link / "board.db")
    assert any(f"remove the symlink {link}" in line for line in found), found
    assert commands_on_links(found) == []
    assert (real.stat().st_mode & 0o7777) == 0o755


def test_a_file_owned_by_a_stranger_is_named(board):
    os.chown(board, 54321, -1)  # a uid no user has
    found = fixes(board)
    assert any("owned by uid 54321" in line for line in found), found


def test_a_hard_link_is_named(board, tmp_path):
    os.link(board, tmp_path / "elsewhere.db")
    found = fixes(board)
    assert any("hard links" in line for line in found), found


def test_a_fifo_where_the_wal_belongs_is_named(board):
    os.mkfifo(f"{board}-wal")
    found = fixes(board)
    assert any("not a regular file" in line and "named pipe" in line for line in found), found


def test_extra_lines_come_last(board):
    checks = list(doctor(board, "root", group=GROUP, extra=[(True, "service: running"), (False, "service: down")]))
    assert checks[-2:] == [(True, "service: running"), (False, "service: down")]
