"""`board backup PATH`: consistent while writers write, never clobbers, shows progress, restores.

The restore test follows "Restoring a backup" (docs/service.md) command by command.
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import os
import re
import signal
import sqlite3
import subprocess
import time

import pytest

from app.errors import BoardError
from app.store import events
from app.store.backup import backup
from app.store.db import connect, write
from tests.conftest import run_board
from tests.safety.writers import check, spawn


def fill(db_path, megabytes: int) -> None:
    """Make the database big enough for a stepwise backup: audit events with bulky details."""
    conn = connect(db_path)
    try:
        with write(conn):
            for i in range(megabytes * 1024 // 4):
                events.record(conn, ts=1, uid=0, actor="filler", action="note", booking_id=None, ok=True,
                              details={"pad": f"{i:08d}" * 512})
    finally:
        conn.close()


@pytest.fixture
def writers(tmp_path):
    """start(db, n) forks n writer processes; they are killed at teardown."""
    pids: list[int] = []
    state = multiprocessing.get_context("fork").RawArray(ctypes.c_int, 8)

    def start(db_path, n: int = 4):
        pids.extend(spawn(db_path, 1000 + slot, state, slot) for slot in range(n))

    yield start
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def counts(db_path) -> tuple[int, int]:
    conn = sqlite3.connect(db_path)
    try:
        return (conn.execute("SELECT count(*) FROM bookings").fetchone()[0],
                conn.execute("SELECT count(*) FROM events").fetchone()[0])
    finally:
        conn.close()


def test_backup_is_consistent_while_writers_write(tmp_path, writers):
    live = tmp_path / "board.db"
    fill(live, 12)
    writers(live, 4)
    time.sleep(0.5)
    before = counts(live)
    copy = tmp_path / "backups" / "board-1.db"
    copy.parent.mkdir()
    result = run_board("backup", str(copy), env={"BOARD_DB": str(live), "BOARD_SIMULATE": "1"})
    time.sleep(0.3)
    after = counts(live)
    assert result.returncode == 0, result.stderr
    progress = [line for line in result.stdout.splitlines() if line.startswith("backup: ")]
    assert 2 <= len(progress) <= 12, result.stdout  # large: progress, but never a flood
    done = [int(re.match(r"backup: (\d+)/(\d+)", line).group(1)) for line in progress]
    assert done == sorted(done), "the backup restarted"
    summary = result.stdout.splitlines()[-2]  # the last says what became of the history
    assert "integrity ok" in summary and "audit chain intact" in summary, summary
    assert after[0] > before[0], "the writers were not writing during the backup"

    invariants = check(copy)  # integrity_check, no partial booking, no overlap, every booking audited, chain intact
    assert before[0] <= invariants["bookings"] <= after[0]
    conn = sqlite3.connect(copy)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert events.first_broken(conn) is None
        # One instant: every create event in the copy has its booking there, and the other way round.
        created = {r[0] for r in conn.execute("SELECT booking_id FROM events WHERE action = 'create' AND ok = 1")}
        assert created == {r[0] for r in conn.execute("SELECT id FROM bookings")}
    finally:
        conn.close()
    assert f"{invariants['bookings']} bookings" in summary
    assert oct(os.stat(copy).st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in copy.parent.iterdir()) == ["board-1.db"]  # no temporary left behind


def test_repeated_backups_under_load_all_verify(tmp_path, writers):
    live = tmp_path / "board.db"
    connect(live).close()
    writers(live, 3)
    for n in range(5):
        copy = tmp_path / f"b{n}.db"
        result = backup(live, copy, pages_per_step=2)  # tiny steps: many chances to see another commit
        assert result.integrity == "ok" and result.first_broken_event is None
        check(copy)
        time.sleep(0.05)


def test_backup_refuses_to_overwrite_without_force(tmp_path):
    live = tmp_path / "board.db"
    env = {"BOARD_DB": str(live), "BOARD_SIMULATE": "1"}
    assert run_board("book", "1", "--for", "1h", env=env).returncode == 0
    target = tmp_path / "precious.db"
    target.write_bytes(b"not yours to overwrite")
    refused = run_board("backup", str(target), env=env)
    assert refused.returncode == 2 and refused.stdout == ""
    assert len(refused.stderr.splitlines()) == 1 and "--force" in refused.stderr
    assert target.read_bytes() == b"not yours to overwrite"
    forced = run_board("backup", str(target), "--force", env=env)
    assert forced.returncode == 0, forced.stderr
    conn = sqlite3.connect(target)
    assert conn.execute("SELECT note FROM bookings").fetchall() == [("",)]
    conn.close()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize("case", ["directory", "missing-dir", "live-itself", "wal-beside", "no-database"])
def test_backup_refuses_bad_targets_in_one_line(tmp_path, case):
    live = tmp_path / "board.db"
    env = {"BOARD_DB": str(live), "BOARD_SIMULATE": "1"}
    if case != "no-database":
        connect(live).close()
    target = {
        "directory": tmp_path,
        "missing-dir": tmp_path / "nope" / "b.db",
        "live-itself": live,
        "wal-beside": tmp_path / "old.db",
        "no-database": tmp_path / "b.db",
    }[case]
    if case == "wal-beside":
        (tmp_path / "old.db-wal").write_bytes(b"")
    args = ["backup", str(target)] + (["--force"] if case == "live-itself" else [])
    result = run_board(*args, env=env)
    assert result.returncode in (1, 2), result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr, result.stderr
    if case == "no-database":
        assert not live.exists()


def history_with(path, *stamps: int) -> None:
    """A history file (as the service's sampler writes it) with one sample of card GPU-0 at each stamp."""
    from app.history.store import HistoryStore, Sample

    store = HistoryStore(path)
    store.card_id("GPU-0", 0, "RTX 5090", 32607)
    store.add([Sample(ts=ts, uuid="GPU-0", state="FREE", dt=10, util=ts % 100) for ts in stamps])
    store.close()


def sampled(path) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        return [ts for (ts,) in conn.execute("SELECT ts FROM sample_view ORDER BY ts")]
    finally:
        conn.close()


def test_backup_copies_the_history_beside_the_database(tmp_path):
    live = tmp_path / "board.db"
    env = {"BOARD_DB": str(live), "BOARD_SIMULATE": "1"}
    assert run_board("book", "1", "--for", "1h", env=env).returncode == 0
    history_with(tmp_path / "board.history.db", 1_795_966_200, 1_795_966_210)
    copy = tmp_path / "backups" / "board-2026-11-29.db"
    copy.parent.mkdir()
    result = run_board("backup", str(copy), env=env)
    assert result.returncode == 0, result.stderr
    beside = tmp_path / "backups" / "board-2026-11-29.history.db"
    assert result.stdout.splitlines()[-1].startswith(f"backed up the history {tmp_path / 'board.history.db'} to {beside}:")
    assert result.stdout.rstrip().endswith("integrity ok")
    assert sorted(p.name for p in copy.parent.iterdir()) == [copy.name, beside.name]  # no -wal, no leftovers
    assert oct(os.stat(beside).st_mode & 0o777) == "0o600"
    assert sampled(beside) == [1_795_966_200, 1_795_966_210]
    assert sorted(p.name for p in copy.parent.iterdir()) == [copy.name, beside.name]  # reading it left nothing


def test_backup_without_a_history_says_so(tmp_path):
    env = {"BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": "1"}
    assert run_board("book", "1", "--for", "1h", env=env).returncode == 0
    result = run_board("backup", str(tmp_path / "b.db"), env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (f"no history at {tmp_path / 'board.history.db'} (the service has not"
                                              " sampled): nothing more to copy")
    assert not (tmp_path / "b.history.db").exists()


def test_a_history_name_in_the_way_is_refused_first_and_force_replaces_it_without_following_it(tmp_path):
    live = tmp_path / "board.db"
    env = {"BOARD_DB": str(live), "BOARD_SIMULATE": "1"}
    assert run_board("book", "1", "--for", "1h", env=env).returncode == 0
    history_with(tmp_path / "board.history.db", 1_795_966_200)
    victim = tmp_path / "victim"
    victim.write_text("not yours")
    copy, beside = tmp_path / "b.db", tmp_path / "b.history.db"
    beside.symlink_to(victim)  # planted where the history's copy goes
    refused = run_board("backup", str(copy), env=env)
    assert refused.returncode == 2 and refused.stdout == "" and "--force" in refused.stderr
    assert len(refused.stderr.splitlines()) == 1
    assert not copy.exists()  # all or nothing: the board's copy was not made either
    forced = run_board("backup", str(copy), "--force", env=env)
    assert forced.returncode == 0, forced.stderr
    assert not beside.is_symlink() and sampled(beside) == [1_795_966_200]
    assert victim.read_text() == "not yours"


def test_restore_as_documented(tmp_path):
    """docs/service.md: stop the agent, move the live files aside, install the copies 0600, doctor."""
    live = tmp_path / "lib" / "board.db"
    live.parent.mkdir(mode=0o700)
    env = {"BOARD_DB": str(live), "BOARD_SIMULATE": "1"}
    booked = json.loads(run_board("book", "2", "--for", "2h", "--note", "keep me", "--json", env=env).stdout)
    history = live.parent / "board.history.db"
    history_with(history, 1_795_966_200)
    copy = tmp_path / "board-backup.db"
    assert run_board("backup", str(copy), env=env).returncode == 0
    assert run_board("book", "2", "--for", "2h", "--asap", "--note", "lost in the disaster", env=env).returncode == 0
    live.write_bytes(b"\0" * 4096)  # the disaster
    history.write_bytes(b"\0" * 4096)

    owner = f"{os.getuid()}"  # the directory's owner: board on the shared install
    script = f"""
    set -e
    cd {live.parent}
    mkdir -p broken && mv board.db board.db-wal board.db-shm broken/ 2>/dev/null || true
    install -m 0600 -o {owner} -g {os.getgid()} {copy} board.db
    mv board.history.db board.history.db-wal board.history.db-shm broken/ 2>/dev/null || true
    install -m 0600 -o {owner} -g {os.getgid()} {tmp_path / "board-backup.history.db"} board.history.db
    """
    subprocess.run(["sh", "-c", script], check=True)
    assert oct(os.stat(live).st_mode & 0o777) == "0o600"
    assert oct(os.stat(history).st_mode & 0o777) == "0o600" and sampled(history) == [1_795_966_200]
    listed = json.loads(run_board("list", "--json", env=env).stdout)["bookings"]
    assert [(b["id"], b["note"]) for b in listed] == [(booked["id"], "keep me")]
    doctor = run_board("doctor", env=env)
    assert "audit chain intact" in doctor.stdout and "integrity: ok" in doctor.stdout, doctor.stdout
    assert f"ok    {live} belongs to" in doctor.stdout, doctor.stdout  # the restored copy: its owner's, 0600
    assert [line for line in doctor.stdout.splitlines() if line.startswith("FIX") and str(live.parent) in line] == []
    assert connect(live).execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # back in WAL on first open


class DirectoryOwner:
    """Stands in for app.store.backup's `os`, and acts as the owner of the backup's directory would (a member,
    while root backs up into it): the moment a file is made there, and again just before a rename, every
    temporary (*.partial) file in it is moved away and its name becomes a symlink to `victim`."""

    def __init__(self, directory, victim, tmpfile: bool):
        self.directory, self.victim, self.tmpfile, self.swapped = directory, victim, tmpfile, 0

    def __getattr__(self, name):
        return getattr(os, name)

    def swap(self) -> None:
        for entry in self.directory.iterdir():
            if entry.name.endswith(".partial") and not entry.is_symlink():
                entry.rename(self.directory / f"moved-{self.swapped}")
                entry.symlink_to(self.victim)
                self.swapped += 1

    def open(self, path, flags, *args, **kwargs):
        if flags & os.O_TMPFILE == os.O_TMPFILE and not self.tmpfile:
            raise OSError(95, "Operation not supported")  # a filesystem without O_TMPFILE: the named way
        fd = os.open(path, flags, *args, **kwargs)
        self.swap()
        return fd

    def link(self, *args, **kwargs):
        os.link(*args, **kwargs)
        self.swap()

    def replace(self, source, target):
        self.swap()
        os.replace(source, target)

    rename = replace


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("tmpfile", [True, False], ids=["O_TMPFILE", "named"])
def test_a_temporary_swapped_for_a_symlink_gets_nothing_written_through_it(tmp_path, monkeypatch, tmpfile, force):
    """The copy is written and placed through its descriptor, never by the temporary's name: whatever the
    directory's owner puts at that name is never opened. A swap it cannot undo (an atomic replace needs a
    name) is reported, and nothing is written through the symlink either."""
    from app.store import backup as module

    live = tmp_path / "board.db"
    env = {"BOARD_DB": str(live), "BOARD_SIMULATE": "1"}
    assert run_board("book", "1", "--for", "1h", "--note", "keep me", env=env).returncode == 0
    victim = tmp_path / "victim"  # root's file elsewhere, say /etc/shadow
    victim.write_bytes(b"")
    directory = tmp_path / "members"
    directory.mkdir()
    target = directory / "board.db"
    if force:
        target.write_bytes(b"an older backup")
    owner = DirectoryOwner(directory, victim, tmpfile)
    monkeypatch.setattr(module, "os", owner)
    swap_undone = force  # --force renames a temporary name onto the target; the owner got there first
    if swap_undone:
        with pytest.raises(BoardError, match="was replaced while the backup was placed there"):
            backup(live, target, force=True)
        assert target.is_symlink()  # the owner's doing, reported: nothing was written through it
    else:
        backup(live, target)
        assert victim.read_bytes() == b"", "the backup was written through the owner's symlink"
        assert not target.is_symlink()
        conn = sqlite3.connect(target)
        try:
            assert conn.execute("SELECT note FROM bookings").fetchall() == [("keep me",)]
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        finally:
            conn.close()
    assert victim.read_bytes() == b"", "the backup was written through the owner's symlink"
    assert owner.swapped == (0 if tmpfile and not force else 1)  # the owner had a name to swap, and swapped it
    assert not [p for p in directory.iterdir() if p.name.endswith(".partial")]
