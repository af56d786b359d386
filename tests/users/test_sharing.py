"""One database, many real Unix users: booking, visibility, file modes, roles, spoofing, outsiders, doctor.

Every `board` here is the real CLI in its own process, run as alice, bob, carol or mallory with
setpriv (runuser where it says so), on a directory made by `board init --group boardusers`.
"""

from __future__ import annotations

import grp
import os
import pwd
import sqlite3
import stat
import subprocess
import sys
import time

import pytest

from tests.users.conftest import ADMIN_GROUP, MEMBERS_GROUP, REPO

pytestmark = pytest.mark.users  # real Unix users; skipped with the reason when not root


HOLD = """
import sys
from app.config import load_config
from app.store.db import connect
conn = connect(load_config().db_path)
conn.execute("SELECT count(*) FROM bookings").fetchone()
print("ready", flush=True)
sys.stdin.readline()
conn.execute("SELECT count(*) FROM bookings").fetchone()
print("still fine", flush=True)
"""

WATCH = """
import json, sys, time
from app.config import load_config
from app.store import bookings as rows
from app.store.db import connect, data_version
conn = connect(load_config().db_path)
seen = data_version(conn)
print("ready", flush=True)
deadline = time.monotonic() + 20
while data_version(conn) == seen and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps([[b.id, b.user, list(b.cards)] for b in rows.live_between(conn, 0, 2**62)]), flush=True)
"""


def one_line(result) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and "Error:" not in lines[0].split(":", 1)[0]
    return lines[0]


def spawn(board, user: str, code: str, umask: int = 0o022) -> subprocess.Popen:
    process = subprocess.Popen(
        board.cmd(user, program=[sys.executable, "-c", code], umask=umask), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=board.environ(user), cwd=REPO,
    )
    line = process.stdout.readline().strip()
    assert line == "ready", process.stderr.read() if process.poll() is not None else line
    return process


def owner_group_mode(path) -> tuple[str, str, int]:
    st = os.stat(path)
    return pwd.getpwuid(st.st_uid).pw_name, grp.getgrgid(st.st_gid).gr_name, stat.S_IMODE(st.st_mode)


# -- init ------------------------------------------------------------------------------------


def test_init_makes_a_setgid_group_directory_and_a_group_writable_file(board):
    st = os.stat(board.dir)
    assert stat.S_IMODE(st.st_mode) == 0o2770 and grp.getgrgid(st.st_gid).gr_name == MEMBERS_GROUP
    assert owner_group_mode(board.db) == ("root", MEMBERS_GROUP, 0o660)
    again = board.run("root", "init", "--group", MEMBERS_GROUP, "--dir", str(board.dir))
    assert again.returncode == 0, again.stderr  # idempotent
    ok = board.run("alice", "doctor")
    assert ok.returncode == 0, ok.stdout
    assert "FIX" not in ok.stdout


# -- two members ----------------------------------------------------------------------------


def test_alice_and_bob_both_book_and_each_sees_the_other_at_once(board):
    bob_watches = spawn(board, "bob", WATCH)
    started = time.monotonic()
    mine = board.book("alice", "2", "--for", "2h", "--note", "alice's sweep")
    seen = bob_watches.communicate(timeout=30)[0].strip()
    lag = time.monotonic() - started
    assert f'[{mine["id"]}, "alice", {mine["cards"]}]'.replace("'", "") in seen.replace("'", "")
    assert lag < 5, f"bob's open connection saw alice's booking only after {lag:.1f} s"

    alice_watches = spawn(board, "alice", WATCH)
    theirs = board.book("bob", "2", "--for", "2h", "--note", "bob's eval")
    seen = alice_watches.communicate(timeout=30)[0]
    assert f'"bob", {theirs["cards"]}' in seen
    assert not set(mine["cards"]) & set(theirs["cards"])

    for viewer in ("alice", "bob"):
        listed = board.json(viewer, "list")["bookings"]
        assert [(b["id"], b["user"], b["note"]) for b in listed] == [
            (mine["id"], "alice", "alice's sweep"), (theirs["id"], "bob", "bob's eval")]
        holders = {c["index"]: c["booking"]["user"] for c in board.json(viewer, "status")["cards"] if c["booking"]}
        assert holders == {**{i: "alice" for i in mine["cards"]}, **{i: "bob" for i in theirs["cards"]}}

    with sqlite3.connect(board.db) as conn:  # the real UIDs, from the kernel
        rows = conn.execute("SELECT user, uid, created_by FROM bookings ORDER BY id").fetchall()
    assert rows == [("alice", pwd.getpwnam("alice").pw_uid, pwd.getpwnam("alice").pw_uid),
                    ("bob", pwd.getpwnam("bob").pw_uid, pwd.getpwnam("bob").pw_uid)]


@pytest.mark.parametrize("umask", [0o077, 0o022], ids=["umask077", "umask022"])
@pytest.mark.parametrize("first", ["alice", "bob", "carol", "root"])
def test_wal_and_shm_work_whoever_opens_first(board, first, umask):
    """The first opener creates -wal and -shm; every other member must still read and write through them."""
    assert not os.path.exists(f"{board.db}-wal") and not os.path.exists(f"{board.db}-shm")
    holder = spawn(board, first, HOLD, umask=umask)  # keeps the connection open, so the files stay
    try:
        for suffix in ("-wal", "-shm"):
            owner, group, mode = owner_group_mode(f"{board.db}{suffix}")
            assert (owner, group) == (first, MEMBERS_GROUP) and mode & 0o660 == 0o660, (suffix, owner, group, oct(mode))
        others = [u for u in ("alice", "bob", "carol") if u != first]
        made = [board.book(user, "1", "--for", "1h", umask=umask) for user in others]
        for user in ("alice", "bob", "carol"):
            listed = board.json(user, "list", umask=umask)["bookings"]
            assert {b["id"] for b in listed} == {b["id"] for b in made}
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "still fine", holder.stderr.read()
    finally:
        holder.communicate(timeout=30)
    assert holder.returncode == 0
    # After the last close SQLite removes them; the next first opener (another user) starts afresh.
    later = board.book("bob" if first != "bob" else "alice", "1", "--for", "1h", umask=umask)
    assert later["id"]
    assert board.run("alice", "doctor", "--group", MEMBERS_GROUP).returncode == 0


@pytest.mark.parametrize("umask", [0o077, 0o022], ids=["umask077", "umask022"])
def test_a_member_who_creates_the_file_leaves_it_usable_for_the_group(board, umask):
    board.db.unlink()  # a fresh install where the first `board` run creates the file, not `board init`
    made = board.book("alice", "1", "--for", "1h", umask=umask)
    assert owner_group_mode(board.db) == ("alice", MEMBERS_GROUP, 0o660)
    assert board.book("bob", "1", "--for", "1h", umask=umask)["id"] == made["id"] + 1
    assert board.run("carol", "doctor").returncode == 0


# -- roles ----------------------------------------------------------------------------------


def refused_events(board, uid: int) -> list[dict]:
    return [e for e in board.json("carol", "log", "--limit", "500")["events"] if e["uid"] == uid and not e["ok"]]


def test_bob_cannot_change_alices_bookings_and_carol_can(board):
    active = board.book("alice", "--cards", "0,1", "--for", "2h", "--note", "active")
    future = board.book("alice", "--cards", "2,3", "--start", "+3h", "--for", "1h", "--note", "future")
    before = board.json("alice", "list")["bookings"]
    bob = pwd.getpwnam("bob").pw_uid
    attempts = [
        ["cancel", str(future["id"])],
        ["cancel", str(active["id"])],
        ["release", str(active["id"])],
        ["extend", str(active["id"]), "--for", "1h"],
        ["extend", str(future["id"]), "--until", "+5h"],
        ["admin", "reassign", str(active["id"]), "--cards", "4,5"],
        ["admin", "reassign", str(active["id"]), "--user", "bob"],
    ]
    for args in attempts:
        result = board.run("bob", *args)
        assert result.returncode == 4, (args, result.stderr)
        line = one_line(result)
        assert line.startswith("board: ") and ("belongs to alice" in line or ADMIN_GROUP in line), line
        assert result.stdout == ""
    assert board.json("alice", "list")["bookings"] == before
    refused = refused_events(board, bob)
    assert sorted(e["action"] for e in refused) == sorted(
        ["cancel", "cancel", "release", "extend", "extend", "reassign", "reassign"])
    assert {e["actor"] for e in refused} == {"bob"}
    assert all(e["details"].get("refused") for e in refused)

    carol = pwd.getpwnam("carol").pw_uid
    assert board.json("carol", "whoami")["admin"] is True
    assert board.json("bob", "whoami")["admin"] is False
    extended = board.json("carol", "extend", str(active["id"]), "--for", "1h")
    assert extended["user"] == "alice"
    moved = board.json("carol", "admin", "reassign", str(active["id"]), "--cards", "4,5")
    assert moved["cards"] == [4, 5]
    given = board.json("carol", "admin", "reassign", str(active["id"]), "--user", "bob")
    assert given["user"] == "bob"
    assert board.json("carol", "extend", str(future["id"]), "--for", "30m")["id"] == future["id"]
    assert board.json("carol", "cancel", str(future["id"]))["status"] == "cancelled"
    assert board.json("carol", "release", str(active["id"]))["id"] == active["id"]
    done = [e for e in board.json("alice", "log", "--limit", "500")["events"] if e["uid"] == carol and e["ok"]]
    assert sorted(e["action"] for e in done) == ["cancel", "extend", "extend", "reassign", "reassign", "release"]
    with sqlite3.connect(board.db) as conn:
        assert conn.execute("SELECT user, uid FROM bookings WHERE id = ?", (active["id"],)).fetchone() == ("bob", bob)
    # The chain still verifies after all of it, for a member too.
    doctor = board.run("bob", "doctor")
    assert doctor.returncode == 0 and "audit chain intact" in doctor.stdout, doctor.stdout


def test_admin_comes_from_the_configured_group_not_the_default(board):
    from tests.users.conftest import write_config

    write_config(board.config, board.db, admin_group="board-no-such-group")
    assert board.json("carol", "whoami")["admin"] is False
    booking = board.book("alice", "1", "--for", "1h")
    assert board.run("carol", "cancel", str(booking["id"])).returncode == 4


@pytest.mark.parametrize("via", ["setpriv", "runuser"])
def test_user_logname_and_sudo_user_change_nothing(board, via):
    alice = pwd.getpwnam("alice").pw_uid
    booking = board.book("alice", "1", "--for", "1h")
    spoof = {"USER": "alice", "LOGNAME": "alice", "USERNAME": "alice", "SUDO_USER": "alice",
             "SUDO_UID": str(alice), "SUDO_GID": str(alice)}
    who = board.json("bob", "whoami", env=spoof, via=via)
    assert (who["user"], who["uid"], who["admin"]) == ("bob", pwd.getpwnam("bob").pw_uid, False)
    result = board.run("bob", "cancel", str(booking["id"]), env=spoof, via=via)
    assert result.returncode == 4 and "belongs to alice" in one_line(result)
    mine = board.book("bob", "1", "--for", "1h", env=spoof, via=via)
    assert mine["user"] == "bob"
    as_root = {"USER": "root", "LOGNAME": "root", "SUDO_USER": "root", "SUDO_UID": "0", "SUDO_GID": "0"}
    assert board.json("bob", "whoami", env=as_root, via=via)["admin"] is False
    assert board.run("bob", "admin", "reassign", str(booking["id"]), "--user", "bob", env=as_root, via=via).returncode == 4
    with sqlite3.connect(board.db) as conn:
        assert conn.execute("SELECT user, uid FROM bookings WHERE id = ?", (mine["id"],)).fetchone() == (
            "bob", pwd.getpwnam("bob").pw_uid)
        actors = conn.execute("SELECT DISTINCT actor, uid FROM events WHERE actor != 'alice'").fetchall()
    assert actors == [("bob", pwd.getpwnam("bob").pw_uid)]


# -- outsiders ------------------------------------------------------------------------------


OUTSIDER_COMMANDS = [
    ["status"], ["list"], ["list", "--json"], ["book", "1", "--for", "1h"], ["cancel", "1"], ["log"], ["extend", "1", "--for", "1h"],
]


@pytest.mark.parametrize("args", OUTSIDER_COMMANDS, ids=lambda a: "-".join(a))
def test_mallory_gets_one_clear_line(board, args):
    result = board.run("mallory", *args)
    assert result.returncode == 4, result.stderr
    line = one_line(result)
    assert "no access to the board database" in line
    assert f"ask an admin to add you to group {MEMBERS_GROUP}" in line
    assert result.stdout == ""


@pytest.mark.parametrize("dir_mode, file_mode", [(0o2775, 0o660), (0o2775, 0o640)])
def test_mallory_is_refused_in_one_line_even_when_the_directory_is_open(board, dir_mode, file_mode):
    board.book("alice", "1", "--for", "1h")
    os.chmod(board.dir, dir_mode)
    os.chmod(board.db, file_mode)
    for args in (["status"], ["book", "1", "--for", "1h"]):
        result = board.run("mallory", *args)
        assert result.returncode == 4, result.stderr
        assert f"ask an admin to add you to group {MEMBERS_GROUP}" in one_line(result)


def test_mallory_can_still_ask_who_she_is(board):
    who = board.json("mallory", "whoami")
    assert (who["user"], who["admin"]) == ("mallory", False)


def test_mallory_doctor_says_to_ask_for_the_group(board):
    result = board.run("mallory", "doctor")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr + result.stdout
    assert f"usermod -aG {MEMBERS_GROUP} mallory" in result.stdout


# -- doctor as a member ---------------------------------------------------------------------


def _chgrp(path, group):
    os.chown(path, -1, grp.getgrnam(group).gr_gid)


BREAKAGES = {
    "file-mode-644": (lambda b: os.chmod(b.db, 0o644), "has mode 644, not 660: chmod 660 {db}"),
    "file-mode-600": (lambda b: os.chmod(b.db, 0o600), None),  # alice can't open it: no access, ask for it
    "file-mode-666": (lambda b: os.chmod(b.db, 0o666), "has mode 666, not 660: chmod 660 {db}"),
    "dir-no-setgid": (lambda b: os.chmod(b.dir, 0o770), "is not setgid, so new files lose group boardusers: chmod g+s {dir}"),
    "dir-mode-2775": (lambda b: os.chmod(b.dir, 0o2775), "others should have no access: chmod 2770 {dir}"),
    "dir-mode-2750": (lambda b: os.chmod(b.dir, 0o2750), "group members need rwx: chmod 2770 {dir}"),
    "file-wrong-group": (lambda b: _chgrp(b.db, "alice"), "has group alice, not boardusers: chgrp boardusers {db}"),
    "dir-wrong-group": (lambda b: (_chgrp(b.dir, "alice"), os.chmod(b.dir, 0o2770)),
                        "has group alice, not boardusers: chgrp -R boardusers {dir}"),
    "dir-group-root": (lambda b: (_chgrp(b.dir, "root"), os.chmod(b.dir, 0o2775)), "has group root"),
}


@pytest.mark.parametrize("name", list(BREAKAGES))
def test_doctor_as_a_member_names_the_problem_and_the_fix(board, name):
    board.book("bob", "1", "--for", "1h")
    breakage, expected = BREAKAGES[name]
    breakage(board)
    args = ["doctor", "--group", MEMBERS_GROUP] if name == "dir-wrong-group" else ["doctor"]
    result = board.run("alice", *args)
    assert result.returncode == 1, result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    fixes = [line for line in result.stdout.splitlines() if line.startswith("FIX")]
    assert fixes, result.stdout
    if expected is None:
        assert any("ask an admin" in f or "chmod 660" in f for f in fixes), fixes
    else:
        expected = expected.format(db=board.db, dir=board.dir)
        assert any(expected in f for f in fixes), (expected, fixes)
    if name == "dir-group-root":
        assert any(f"chgrp -R G {board.dir}" in f for f in fixes), fixes


def test_doctor_as_a_member_checks_wal_and_shm_too(board):
    holder = spawn(board, "bob", HOLD)
    try:
        os.chmod(f"{board.db}-wal", 0o600)
        result = board.run("root", "doctor")
        assert f"{board.db}-wal has mode 600, not 660: chmod 660 {board.db}-wal" in result.stdout
        os.chmod(f"{board.db}-wal", 0o660)
        _chgrp(f"{board.db}-shm", "bob")
        result = board.run("bob", "doctor")
        assert f"{board.db}-shm has group bob, not boardusers: chgrp boardusers {board.db}-shm" in result.stdout
    finally:
        holder.communicate("\n", timeout=30)
