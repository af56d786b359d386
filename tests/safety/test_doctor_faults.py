"""`board doctor` on a damaged or tampered directory: one FIX line each, no traceback, no fix that follows a link.

One owner: the database's directory (0700) and SQLite's files in it (0600) all belong to the
directory's owner (the user board on the shared install, you for a database of your own).
Whoever else got something in there (root by mistake, or through an older loose layout) may
have planted a symlink where SQLite keeps its files, hard-linked a file in, or left a file of
someone else's. doctor must name each, must not open the database through it, and must never
print a chmod/chown whose path is a symlink (those commands follow it): the fix is to remove it.
"""

from __future__ import annotations

import os
import pwd
import re
import stat
import subprocess
from pathlib import Path

import pytest

from app.store import events
from app.store.db import connect, write
from app.store.setup import doctor
from tests.conftest import run_board

PAGE = 4096
NOT_OPENED = "was not opened"
STRANGER = next((p for p in pwd.getpwall() if p.pw_uid not in (0, os.getuid()) and p.pw_name == "nobody"),
                next((p for p in pwd.getpwall() if p.pw_uid not in (0, os.getuid())), None))
needs_root = pytest.mark.skipif(os.geteuid() != 0 or STRANGER is None, reason="chown to another user needs root")


@pytest.fixture
def board(tmp_path) -> Path:
    """A database of one owner (0700 directory, 0600 file) with about a hundred pages of audit events."""
    directory = tmp_path / "board"
    directory.mkdir(mode=0o700)
    db = directory / "board.db"
    conn = connect(db)
    with write(conn):
        for n in range(200):
            events.record(conn, ts=n, uid=0, actor="root", action="note", booking_id=None, ok=True,
                          details={"pad": "y" * 1500})
    conn.close()
    db.chmod(0o600)
    assert not Path(f"{db}-wal").exists()
    return db


def fixes(db: Path, **kwargs) -> list[str]:
    return [line for ok, line in doctor(db, "root", **kwargs) if not ok]


def commands_on_links(lines: list[str]) -> list[str]:
    """Every chmod/chown/chgrp in `lines` whose path is a symlink (or lies under one), or that follows links."""
    bad = []
    for line in lines:
        for match in re.finditer(r"\b(chmod|chown|chgrp)\b((?:\s+-\S+)*)\s+\S+\s+(/\S+)", line):
            path = Path(match.group(3))
            if any(p.is_symlink() for p in (path, *path.parents)):
                bad.append(line)
            if match.group(1) != "chmod" and "-h" not in match.group(2).split():
                bad.append(line)  # chown/chgrp without -h would follow a link planted after doctor looked
    return bad


def apply(lines: list[str]) -> None:
    """Run the chmod/chown commands that the FIX lines suggest, as a person would paste them."""
    for line in lines:
        for command in re.findall(r"\b(?:chmod|chown) (?:-h )?\S+ /\S+", line):
            subprocess.run(["sh", "-c", command], check=True)


def test_a_healthy_board_has_nothing_to_fix(board):
    checks = list(doctor(board, "root"))
    assert [line for ok, line in checks if not ok] == []
    assert f"{board.parent} belongs to {pwd.getpwuid(os.getuid()).pw_name}, mode 700" in [line for _, line in checks]
    assert any("audit chain intact (200 events)" in line for _, line in checks)


@pytest.mark.parametrize("mode, fix", [(0o755, "chmod 700"), (0o750, "chmod 700"), (0o2770, "chmod 00700"),
                                       (0o1700, "chmod 00700")])
def test_a_loose_directory_is_one_fix_that_works(board, mode, fix):
    board.parent.chmod(mode)
    found = fixes(board)
    assert found == [line for line in found if f"{fix} {board.parent}" in line] and len(found) == 1, found
    apply(found)
    assert stat.S_IMODE(board.parent.stat().st_mode) == 0o700  # plain `chmod 700` would keep the setgid bit
    assert fixes(board) == []


@pytest.mark.parametrize("suffix, mode", [("", 0o660), ("", 0o644), ("", 0o400), ("-wal", 0o664), ("-shm", 0o644),
                                          ("-journal", 0o666)])
def test_a_loose_file_is_one_fix_that_works(board, suffix, mode):
    path = Path(f"{board}{suffix}")
    live = connect(board) if suffix in ("-wal", "-shm") else None  # a running service keeps its -wal and -shm
    if live is not None:
        live.execute("SELECT count(*) FROM events").fetchone()
    try:
        if suffix == "-journal":
            path.write_bytes(b"")  # an empty leftover: SQLite ignores it in WAL mode, doctor still checks it
        assert path.exists()
        path.chmod(mode)
        found = fixes(board)
        assert len(found) == 1 and f"has mode {mode:o}, not 600" in found[0] and f"chmod 600 {path}" in found[0], found
        apply(found)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert fixes(board) == []
    finally:
        if live is not None:
            live.close()


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
    result = run_board("doctor", env={"BOARD_DB": str(board), "BOARD_SIMULATE": "1"})
    assert "Traceback" not in result.stdout + result.stderr
    assert result.returncode == 1 and result.stderr == ""
    about_the_file = [line for line in result.stdout.splitlines() if line.startswith("FIX") and str(board) in line]
    assert len(about_the_file) == 1 and "damaged" in about_the_file[0], result.stdout


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm", "-journal"])
def test_a_planted_symlink_is_named_and_not_followed(board, suffix):
    victim = board.parent.parent / "victim"
    victim.write_bytes(b"precious")
    victim.chmod(0o644)  # something for doctor to want to chmod, were it to follow the link
    link = Path(f"{board}{suffix}")
    if suffix == "":
        os.rename(board, board.parent.parent / "real.db")
    os.symlink(victim, link)
    found = fixes(board)
    assert any(f"remove the symlink {link}" in line for line in found), found
    assert any(NOT_OPENED in line for line in found), found
    assert commands_on_links(found) == []
    assert victim.read_bytes() == b"precious" and (victim.stat().st_mode & 0o777) == 0o644
    assert not Path(f"{victim}-wal").exists() and not Path(f"{victim}-shm").exists()


def test_a_symlinked_directory_is_named_and_no_fix_follows_it(board, tmp_path):
    real = board.parent
    real.chmod(0o755)  # something for doctor to want to chmod
    board.chmod(0o644)
    link = tmp_path / "linked"
    os.symlink(real, link)
    found = fixes(link / "board.db")
    assert len(found) == 1 and f"remove the symlink {link}" in found[0], found
    assert commands_on_links(found) == []
    assert (real.stat().st_mode & 0o7777) == 0o755 and (board.stat().st_mode & 0o777) == 0o644


def test_a_file_owned_by_a_uid_no_user_has_is_named_and_not_opened(board):
    os.chown(board, 54321, -1)
    found = fixes(board)
    assert any(f"{board} is owned by uid 54321, which no user has" in line and f"remove {board}" in line
               for line in found), found
    assert any(NOT_OPENED in line for line in found), found
    assert commands_on_links(found) == []


@needs_root
@pytest.mark.parametrize("suffix", ["", "-wal", "-shm", "-journal"])
def test_a_file_of_another_user_is_named_and_not_opened(board, suffix):
    path = Path(f"{board}{suffix}")
    if suffix:
        path.write_bytes(b"")
        path.chmod(0o600)
    os.chown(path, STRANGER.pw_uid, -1)
    found = fixes(board)
    me = pwd.getpwuid(os.getuid()).pw_name
    assert any(f"{path} is owned by {STRANGER.pw_name} (uid {STRANGER.pw_uid}), not by {me}" in line
               and f"chown -h {me} {path}" in line for line in found), found
    assert any(NOT_OPENED in line for line in found), found
    assert commands_on_links(found) == []
    apply(found)  # the owner said it is theirs: chown -h gives it back, and then all is well
    assert fixes(board) == []


@needs_root
def test_the_one_owner_is_the_directorys_not_whoever_runs_doctor(board):
    """On the shared install the directory and files are the service user's; root's doctor is content."""
    for path in (board.parent, board):
        os.chown(path, STRANGER.pw_uid, STRANGER.pw_gid)
    checks = list(doctor(board, "root"))
    assert [line for ok, line in checks if not ok] == []
    assert f"{board} belongs to {STRANGER.pw_name}, mode 600" in [line for _, line in checks]
    assert all(os.stat(p).st_uid == STRANGER.pw_uid for p in board.parent.iterdir())  # what SQLite made is theirs
    os.chown(board, 0, 0)  # now root's file in their directory is the stranger
    found = fixes(board)
    assert any(f"{board} is owned by root (uid 0), not by {STRANGER.pw_name}" in line for line in found), found
    assert any(NOT_OPENED in line for line in found), found


def test_a_hard_link_is_named_and_not_opened(board, tmp_path):
    os.link(board, tmp_path / "elsewhere.db")
    found = fixes(board)
    assert any("2 hard links" in line and f"-samefile {board}" in line for line in found), found
    assert any(NOT_OPENED in line for line in found), found


def test_a_fifo_where_the_wal_belongs_is_named(board):
    os.mkfifo(f"{board}-wal", 0o600)
    found = fixes(board)
    assert any("not a regular file" in line and "named pipe" in line and f"remove {board}-wal" in line
               for line in found), found
    assert any(NOT_OPENED in line for line in found), found


def test_a_missing_database_or_directory_is_one_line(board, tmp_path):
    found = fixes(board.parent / "other.db")
    assert len(found) == 1 and "other.db does not exist" in found[0], found
    found = fixes(tmp_path / "nowhere" / "board.db")
    assert len(found) == 1 and "does not exist" in found[0] and "-m 0700" in found[0], found
    assert not (tmp_path / "nowhere").exists()


def test_every_line_is_one_line(board, tmp_path):
    board.parent.chmod(0o2770)
    os.symlink(tmp_path, f"{board}-wal")
    os.mkfifo(f"{board}-shm")
    for ok, line in doctor(board, "no-such-admin-group"):
        assert "\n" not in line and line.strip() == line


def test_extra_lines_come_last(board):
    checks = list(doctor(board, "root", extra=[(True, "service: running"), (False, "service: down")]))
    assert checks[-2:] == [(True, "service: running"), (False, "service: down")]


def test_the_retired_group_option_and_init_are_gone(board):
    env = {"BOARD_DB": str(board), "BOARD_SIMULATE": "1"}
    for args in (["doctor", "--group", "users"], ["init", "--group", "users"]):
        result = run_board(*args, env=env)
        assert result.returncode == 2 and "Traceback" not in result.stderr, (args, result.stderr)
