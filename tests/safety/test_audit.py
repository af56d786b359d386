"""The audit log: append-only by trigger, hash-chained, and `board doctor` names the first row a hand edit touched.

Every edit here is what whoever may open the file (root, the service user board, or the one owner
of a database of their own) could do with any SQLite client: the threat model (docs/threat-model.md) says
such edits are not prevented, only made visible.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from app.store import events
from app.store.db import connect
from tests.conftest import run_board

ROWS = 8


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A database with ROWS real audit events (bookings, a cancel, a refusal), made by the CLI."""
    env = {"BOARD_DB": str(tmp_path_factory.mktemp("audit") / "board.db"), "BOARD_SIMULATE": "1"}
    for n in range(3):
        assert run_board("book", "--cards", str(n), "--for", "1h", "--note", f"job {n}", env=env).returncode == 0
    assert run_board("book", "--cards", "0", "--for", "1h", env=env).returncode == 3  # refused: recorded
    assert run_board("cancel", "999", env=env).returncode == 2  # bad input: not recorded
    for n in range(3, 5):
        assert run_board("book", "--cards", str(n), "--start", "+2h", "--for", "1h", env=env).returncode == 0
    assert run_board("cancel", "4", env=env).returncode == 0
    assert run_board("extend", "1", "--for", "30m", env=env).returncode == 0
    raw = sqlite3.connect(env["BOARD_DB"])
    assert raw.execute("SELECT count(*) FROM events").fetchone()[0] == ROWS
    raw.close()
    assert not Path(f"{env['BOARD_DB']}-wal").exists()
    return Path(env["BOARD_DB"])


@pytest.fixture
def audited(template, tmp_path):
    """A fresh copy of the template for each test to edit."""
    shutil.copyfile(template, tmp_path / "board.db")
    return {"BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": "1"}


def hand_edit(env, *statements: str, params=()) -> None:
    """What a member could do with the sqlite3 shell."""
    raw = sqlite3.connect(env["BOARD_DB"], isolation_level=None)
    try:
        for statement in statements:
            raw.execute(statement, params if "?" in statement else ())
    finally:
        raw.close()


def doctor(env):
    result = run_board("doctor", env=env)
    assert "Traceback" not in result.stdout + result.stderr
    return result


def audit_fixes(result) -> list[str]:
    """doctor's FIX lines about the file's contents (a test directory's permissions are not the point here)."""
    return [line for line in result.stdout.splitlines()
            if line.startswith("FIX") and any(word in line for word in ("audit", "trigger", "booking"))]


def test_the_log_records_changes_and_refusals_with_the_uid(audited):
    logged = json.loads(run_board("log", "--json", "--limit", "100", env=audited).stdout)["events"]
    assert len(logged) == ROWS
    assert [e["action"] for e in reversed(logged)] == [
        "create", "create", "create", "create", "create", "create", "cancel", "extend"]
    assert [e["ok"] for e in reversed(logged)] == [True, True, True, False, True, True, True, True]
    assert {e["uid"] for e in logged} == {0}
    assert "booked by root" in logged[-4]["details"]["refused"]


@pytest.mark.parametrize("statement", [
    "UPDATE events SET actor = 'someone else' WHERE id = 2",
    "UPDATE events SET ok = 1",
    "UPDATE events SET hash = prev_hash WHERE id = (SELECT max(id) FROM events)",
    "DELETE FROM events WHERE id = 3",
    "DELETE FROM events",
    "UPDATE OR REPLACE events SET id = 1 WHERE id = 2",
    "INSERT OR REPLACE INTO events (id, ts, uid, actor, action, booking_id, ok, details, prev_hash, hash)"
    " SELECT id, ts, uid, 'mallory', action, booking_id, ok, details, prev_hash, hash FROM events WHERE id = 6",
    "INSERT INTO events (id, ts, uid, actor, action, ok, prev_hash, hash) VALUES (0, 0, 0, 'x', 'create', 1, '', '')",
])
def test_update_and_delete_are_refused_by_triggers(audited, statement):
    before = sqlite3.connect(audited["BOARD_DB"]).execute("SELECT * FROM events").fetchall()
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        hand_edit(audited, statement)
    assert sqlite3.connect(audited["BOARD_DB"]).execute("SELECT * FROM events").fetchall() == before
    assert audit_fixes(doctor(audited)) == []


def test_the_app_cannot_replace_an_event_either(audited):
    conn = connect(audited["BOARD_DB"])
    try:
        row = conn.execute("SELECT * FROM events WHERE id = 2").fetchone()
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
    finally:
        conn.close()


def tamper_cases():
    drop = "DROP TRIGGER events_no_update"
    drop_delete = "DROP TRIGGER events_no_delete"
    return {
        # name: (statements, the event doctor must name)
        "edit-actor": ([drop, "UPDATE events SET actor = 'bob' WHERE id = 4"], 4),
        "edit-refusal-to-success": ([drop, "UPDATE events SET ok = 1 WHERE id = 4"], 4),
        "edit-details": ([drop, "UPDATE events SET details = '{}' WHERE id = 2"], 2),
        "edit-time": ([drop, "UPDATE events SET ts = ts - 86400 WHERE id = 7"], 7),
        "edit-uid": ([drop, "UPDATE events SET uid = 1001 WHERE id = 1"], 1),
        "edit-first-link": ([drop, "UPDATE events SET prev_hash = hash WHERE id = 1"], 1),
        "edit-last": ([drop, f"UPDATE events SET booking_id = 99 WHERE id = {ROWS}"], ROWS),
        "delete-middle": ([drop_delete, "DELETE FROM events WHERE id = 5"], 5),
        "delete-two": ([drop_delete, "DELETE FROM events WHERE id IN (3, 4)"], 3),
        "delete-first": ([drop_delete, "DELETE FROM events WHERE id = 1"], 1),
        "forge-appended": ([
            "INSERT INTO events (ts, uid, actor, action, booking_id, ok, details, prev_hash, hash)"
            " SELECT ts, 0, 'root', 'cancel', 2, 1, '{}', hash, hash FROM events ORDER BY id DESC LIMIT 1"], ROWS + 1),
        "replace-row": ([
            "DROP TRIGGER events_no_replace",
            "INSERT OR REPLACE INTO events (id, ts, uid, actor, action, booking_id, ok, details, prev_hash, hash)"
            " SELECT id, ts, uid, 'mallory', action, booking_id, ok, details, prev_hash, hash FROM events WHERE id = 6"], 6),
        "not-utf8": ([drop, "UPDATE events SET details = CAST(x'7b22223a22ff227d' AS TEXT) WHERE id = 3"], 3),
    }


@pytest.mark.parametrize("name", list(tamper_cases()))
def test_doctor_names_the_first_tampered_row(audited, name):
    statements, expected = tamper_cases()[name]
    hand_edit(audited, *statements)
    result = doctor(audited)
    assert result.returncode == 1, result.stdout
    assert f"FIX   audit event {expected} was altered or removed by hand" in result.stdout, result.stdout
    for args in (["list", "--all"], ["log"]):  # the board keeps working on a tampered file
        assert run_board(*args, env=audited).returncode == 0


def test_a_row_rewritten_with_a_recomputed_hash_is_named(audited):
    """The editor recomputes row 3's hash to match its new fields: row 4's link still names row 3."""
    raw = sqlite3.connect(audited["BOARD_DB"], isolation_level=None)
    try:
        raw.execute("DROP TRIGGER events_no_update")
        id_, ts, uid, actor, action, booking_id, ok, details, prev = raw.execute(
            "SELECT id, ts, uid, actor, action, booking_id, ok, details, prev_hash FROM events WHERE id = 3").fetchone()
        forged = events._digest(prev, ts, uid, "carol", action, booking_id, bool(ok), details)
        raw.execute("UPDATE events SET actor = 'carol', hash = ? WHERE id = 3", (forged,))
    finally:
        raw.close()
    assert "FIX   audit event 3 was altered or removed by hand" in doctor(audited).stdout


def test_doctor_reports_dropped_guard_triggers(audited):
    hand_edit(audited, "DROP TRIGGER events_no_delete", "DROP TRIGGER bookings_no_overlap")
    result = doctor(audited)
    assert result.returncode == 1
    assert "trigger(s) events_no_delete, bookings_no_overlap missing" in result.stdout
    assert "audit chain intact" in result.stdout  # nothing was edited yet: only the guard is gone


def test_doctor_reports_bookings_without_their_audit_record(audited):
    """Removing the newest events leaves a valid chain; the bookings they created give it away."""
    hand_edit(audited, "DROP TRIGGER events_no_delete", "DELETE FROM events WHERE id >= 5")
    result = doctor(audited)
    assert "booking(s) 4, 5 have no audit record of their creation" in result.stdout, result.stdout


def test_doctor_survives_a_missing_events_table(audited):
    hand_edit(audited, "DROP TABLE events")
    result = doctor(audited)
    assert result.returncode == 1
    assert "audit log" in result.stdout and "can't be read" in result.stdout, result.stdout


def test_an_intact_file_passes(audited):
    result = doctor(audited)
    assert audit_fixes(result) == [], result.stdout
    assert f"audit chain intact ({ROWS} events)" in result.stdout


def test_a_split_by_an_admins_reassign_is_the_new_bookings_audit_record(audited):
    """reassign splits an active booking at now; its event (filed under the old id) records the new one."""
    start = sqlite3.connect(audited["BOARD_DB"]).execute("SELECT starts_at FROM bookings WHERE id = 1").fetchone()[0]
    while time.time() < start + 1.05:  # under way for at least a second, so the move splits it
        time.sleep(0.05)
    moved = run_board("admin", "reassign", "1", "--cards", "6", "--json", env=audited)
    assert moved.returncode == 0, moved.stderr
    rest = json.loads(moved.stdout)["id"]
    assert rest != 1
    assert audit_fixes(doctor(audited)) == []
    hand_edit(audited, "DROP TRIGGER events_no_delete", "DELETE FROM events WHERE action = 'reassign'")
    assert f"booking(s) {rest} have no audit record of their creation" in doctor(audited).stdout
