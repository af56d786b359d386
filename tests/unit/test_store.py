import sqlite3

import pytest

from app.errors import BadInput, NotPermitted
from app.store import events, schema
from app.store.db import StoreError, connect, data_version, write
from tests.conftest import sqlite_only


@sqlite_only  # SQLite's pragmas and file
def test_every_connection_sets_the_pragmas(conn):
    """synchronous FULL (2): in WAL, NORMAL (1) syncs only at checkpoints, so a booking acknowledged just before a
    power cut could be lost; an acknowledged booking is durable."""
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 5000
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.LATEST


def test_write_rolls_back_on_error(conn):
    with pytest.raises(RuntimeError):
        with write(conn):
            conn.execute("INSERT INTO cards (uuid, idx, seen_at) VALUES ('GPU-x', 0, 0)")
            raise RuntimeError("boom")
    assert conn.execute("SELECT count(*) FROM cards").fetchone()[0] == 0
    assert not conn.in_transaction


@sqlite_only  # SQLite's pragmas and file
def test_data_version_moves_when_another_connection_commits(db_path, conn):
    before = data_version(conn)
    other = connect(db_path)
    with write(other):
        other.execute("INSERT INTO cards (uuid, idx, seen_at) VALUES ('GPU-x', 0, 0)")
    assert data_version(conn) != before
    same = data_version(conn)
    assert data_version(conn) == same


def test_events_are_append_only(conn):
    with write(conn):
        events.record(conn, ts=1, uid=0, actor="root", action="create", booking_id=None, ok=True)
    for statement in ("UPDATE events SET actor = 'eve'", "DELETE FROM events"):
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            conn.execute(statement)


def test_the_tail_is_the_last_events_id_and_0_before_any(conn):
    assert events.tail(conn) == 0
    with write(conn):
        events.record(conn, ts=1, uid=0, actor="root", action="create", booking_id=1, ok=True)
        events.record(conn, ts=2, uid=0, actor="root", action="create", booking_id=None, ok=False)
    newest, older = events.recent(conn, 2)
    assert events.tail(conn) == newest.id > older.id  # a refused attempt moves it too


def test_each_event_links_to_the_last_one_and_its_hash_is_the_digest_of_what_is_stored(conn):
    """The first event follows GENESIS and each next one the last one's hash; the details are stored as sorted JSON
    ({} for none) with the host whose service vouched for the actor; the hash covers exactly the stored fields."""
    conn.fleet_host = "gpu3"  # as app.service.Service sets it
    with write(conn):
        events.record(conn, ts=1, uid=1001, actor="alice", action="create", booking_id=7, ok=True,
                      details={"z": 1, "a": "é"})
        events.record(conn, ts=2, uid=0, actor="root", action="cancel", booking_id=None, ok=False)
    first, second = conn.execute("SELECT details, prev_hash, hash FROM events ORDER BY id").fetchall()
    assert (first[0], second[0]) == ('{"a": "é", "host": "gpu3", "z": 1}', '{"host": "gpu3"}')
    assert (first[1], second[1]) == (events.GENESIS, first[2])
    assert events.first_broken(conn) is None  # each hash recomputed from the stored fields


@sqlite_only  # SQLite's pragmas and file
def test_a_hand_edit_breaks_the_chain_at_that_row(conn):
    with write(conn):
        for n in range(5):
            events.record(conn, ts=n, uid=0, actor="root", action="create", booking_id=n, ok=True)
    assert events.first_broken(conn) is None
    conn.execute("DROP TRIGGER events_no_update")
    conn.execute("UPDATE events SET actor = 'someone' WHERE id = 3")
    assert events.first_broken(conn) == 3


def test_a_newer_schema_is_refused(db_path):
    connect(db_path).close()
    raw = sqlite3.connect(db_path)
    raw.execute(f"PRAGMA user_version = {schema.LATEST + 1}")
    raw.close()
    with pytest.raises(StoreError, match="newer than this board"):
        connect(db_path)


def test_migrating_twice_is_harmless(db_path):
    connect(db_path).close()
    conn = connect(db_path)
    schema.migrate(conn)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.LATEST


def test_a_missing_directory_says_what_to_do(tmp_path):
    with pytest.raises(BadInput, match="does not exist; create it, or set BOARD_DB") as caught:
        connect(tmp_path / "nowhere" / "board.db")
    assert caught.value.exit_code == 2 and "\n" not in str(caught.value)
    with pytest.raises(BadInput, match="does not exist"):
        connect(tmp_path / "nowhere" / "board.db", create=False)


def test_a_file_that_is_not_a_database(tmp_path):
    path = tmp_path / "board.db"
    path.write_text("hello, this is not sqlite" * 100)
    with pytest.raises(BadInput, match="not a usable board database") as caught:
        connect(path)
    assert caught.value.exit_code == 2 and "\n" not in str(caught.value)


def test_a_network_filesystem_is_refused(tmp_path, monkeypatch):
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/vda / ext4 rw 0 0\nserver:/export {tmp_path} nfs4 rw 0 0\n")
    monkeypatch.setattr("app.store.filesystem.MOUNTS", mounts)
    with pytest.raises(StoreError, match="on a nfs4 filesystem; SQLite's WAL needs a local disk"):
        connect(tmp_path / "board.db")
    assert not (tmp_path / "board.db").exists()


def test_unreadable_database_is_not_permitted(tmp_path):
    import os

    if os.getuid() == 0:
        pytest.skip("root reads everything; tests/users covers this with a real unprivileged user")
    path = tmp_path / "board.db"
    connect(path).close()
    path.chmod(0)
    with pytest.raises(NotPermitted, match="no access to the board database"):
        connect(path)
