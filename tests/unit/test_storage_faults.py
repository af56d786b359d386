"""Storage faults get their own one-line message: a full disk, a read-only database or filesystem, a symlink loop.

The full disk and the read-only filesystem are real: a small tmpfs mounted for the test (root only;
the test is skipped, saying why, where mount is not permitted). chmod 0444 does not stop root, so a
read-only database is also opened with SQLite's own `mode=ro`.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from app.errors import BadInput, NotPermitted
from app.store import events
from app.store.db import StoreError, connect, storage_error, write


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size) -> a fresh tmpfs of that size under tmp_path; unmounted at teardown."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        point = tmp_path / f"tmpfs{len(mounted)}"
        point.mkdir()
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(point)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"can't mount a tmpfs here (needs root and CAP_SYS_ADMIN): {result.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in reversed(mounted):
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def fill(directory: Path) -> None:
    """Write filler until the filesystem refuses another byte (whole blocks, then single bytes)."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for chunk in (b"\0" * 4096, b"\0"):
            while True:
                try:
                    os.write(fd, chunk)
                except OSError as error:
                    assert error.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)


def one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text and text, text
    return text


def test_a_full_disk_refuses_a_write_in_one_line_and_keeps_what_was_there(tmpfs):
    db = tmpfs("512k") / "board.db"
    conn = connect(db)
    with write(conn):
        conn.execute("INSERT INTO cards (uuid, idx, seen_at) VALUES ('GPU-a', 0, 0)")
    fill(db.parent)
    with pytest.raises(StoreError) as caught:
        with write(conn):
            events.record(conn, ts=1, uid=0, actor="root", action="note", booking_id=None, ok=True,
                          details={"pad": "x" * 400_000})
    message = one_line(caught.value)
    assert caught.value.exit_code == 1
    assert "is full" in message and str(db) in message and "group" not in message
    assert not conn.in_transaction
    assert conn.execute("SELECT uuid FROM cards").fetchall() == [("GPU-a",)]
    conn.close()


def test_a_full_disk_when_creating_the_database_says_so(tmpfs):
    directory = tmpfs("64k")
    fill(directory)
    with pytest.raises(StoreError) as caught:
        connect(directory / "board.db")
    message = one_line(caught.value)
    assert "is full" in message, message
    assert "rollback" not in message  # the failed ROLLBACK after SQLite's own is not the story


def test_a_read_only_filesystem_is_named(tmpfs):
    directory = tmpfs("1m")
    connect(directory / "board.db").close()
    remount = subprocess.run(["mount", "-o", "remount,ro", str(directory)], capture_output=True, text=True)
    if remount.returncode != 0:
        pytest.skip(f"can't remount read-only: {remount.stderr.strip()}")
    with pytest.raises(StoreError) as caught:
        connect(directory / "board.db")
    message = one_line(caught.value)
    assert caught.value.exit_code == 1
    assert "read-only filesystem" in message and "add you to group" not in message


def test_a_read_only_database_is_named(db_path):
    connect(db_path).close()
    readonly = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, isolation_level=None)
    try:
        with pytest.raises(StoreError) as caught:
            with write(readonly):
                readonly.execute("INSERT INTO cards (uuid, idx, seen_at) VALUES ('GPU-a', 0, 0)")
    finally:
        readonly.close()
    message = one_line(caught.value)
    assert caught.value.exit_code == 1
    assert "read-only" in message and str(db_path) in message and "add you to group" not in message


@pytest.mark.parametrize("where", ["file", "directory"])
def test_a_symlink_loop_is_named(tmp_path, where):
    if where == "file":
        os.symlink(tmp_path / "b.db", tmp_path / "a.db")
        os.symlink(tmp_path / "a.db", tmp_path / "b.db")
        path = tmp_path / "a.db"
    else:
        os.symlink(tmp_path / "loop", tmp_path / "loop")
        path = tmp_path / "loop" / "board.db"
    with pytest.raises(StoreError) as caught:
        connect(path)
    message = one_line(caught.value)
    assert caught.value.exit_code == 1
    assert "symbolic link loop" in message and "group" not in message


def test_a_file_that_is_not_a_database_is_bad_input(tmp_path):
    path = tmp_path / "board.db"
    path.write_bytes(os.urandom(8192))
    with pytest.raises(BadInput) as caught:
        connect(path)
    assert caught.value.exit_code == 2 and "not a usable board database" in one_line(caught.value)


def test_a_directory_where_the_database_should_be_is_bad_input(tmp_path):
    (tmp_path / "board.db").mkdir()
    with pytest.raises(BadInput):
        connect(tmp_path / "board.db")


def test_a_planted_wal_symlink_is_refused_and_not_written_through(tmp_path):
    db = tmp_path / "board.db"
    connect(db).close()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.symlink(victim, f"{db}-wal")
    with pytest.raises(StoreError, match="is a symbolic link") as caught:
        connect(db)
    assert "remove the symlink" in one_line(caught.value)
    assert victim.read_bytes() == b"precious"


@pytest.mark.parametrize("message, expected", [
    ("database or disk is full", "is full"),
    ("attempt to write a readonly database", "read-only"),
    ("database disk image is malformed", "damaged"),
])
def test_storage_error_names_the_fault(db_path, message, expected):
    connect(db_path).close()
    error = storage_error(db_path, sqlite3.OperationalError(message))
    assert expected in one_line(error) and error.exit_code == 1
    assert not isinstance(error, NotPermitted)


def test_storage_error_looks_past_a_failed_rollback(db_path):
    connect(db_path).close()
    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError:
            raise sqlite3.OperationalError("cannot rollback - no transaction is active")
    except sqlite3.OperationalError as error:
        assert "is full" in str(storage_error(db_path, error))
