"""One service, many real Unix users: booking, visibility, roles, spoofing, outsiders, the database nobody else opens.

Every `board` here is the real CLI in its own process, run as alice, bob, carol or mallory with
setpriv (runuser where it says so), talking to `board agent` (run as the system user board, as the
unit runs it) over its socket. BOARD_CONFIG names the prefix's config, which names the socket.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import stat
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest

from tests.unix_users import ADMIN_GROUP, MEMBERS_GROUP, SERVICE_USER
from tests.users.conftest import config_text


# Subscribes to bookings over the socket, says ready, and prints the list after the first change.
WATCH = """
import json
from app.client.socket import SocketClient
from app.config import load_config
path = load_config().service.socket
sock, reader, _ = SocketClient(path).stream("subscribe", {"kinds": ["bookings"]})
sock.settimeout(20)
print("ready", flush=True)
while json.loads(reader.readline()).get("event") != "bookings":
    pass
listed = SocketClient(path).call("list")["bookings"]
print(json.dumps([[b["id"], b["user"], b["cards"]] for b in listed]), flush=True)
"""

OPEN_DB = """
import errno, sqlite3, sys
for path in sys.argv[1:]:
    try:
        open(path, "rb").close()
        print(path, "opened")
    except OSError as error:
        print(path, errno.errorcode[error.errno])
try:
    sqlite3.connect(sys.argv[1]).execute("SELECT count(*) FROM bookings").fetchone()
    print("sqlite opened")
except sqlite3.Error as error:
    print("sqlite:", error)
"""


def one_line(result) -> str:
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and "Error:" not in lines[0].split(":", 1)[0]
    return lines[0]


def spawn(board, user: str, code: str) -> subprocess.Popen:
    process = board.spawn(user, program=[sys.executable, "-c", code], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline().strip()
    assert line == "ready", process.stderr.read() if process.poll() is not None else line
    return process


def owner_group_mode(path) -> tuple[str, str, int]:
    st = os.lstat(path)
    return pwd.getpwuid(st.st_uid).pw_name, grp.getgrgid(st.st_gid).gr_name, stat.S_IMODE(st.st_mode)


def refused_events(board, uid: int) -> list[dict]:
    return [e for e in board.log() if e["uid"] == uid and not e["ok"]]


# -- the service owns the file ---------------------------------------------------------------


def test_the_service_alone_owns_the_database_and_runs_as_board_with_cap_kill_only(board):
    board.book("alice", "1", "--for", "1h")  # the database and its -wal/-shm exist and are in use
    assert owner_group_mode(board.dir) == (SERVICE_USER, SERVICE_USER, 0o700)
    for suffix in ("", "-wal", "-shm"):
        assert owner_group_mode(f"{board.db}{suffix}") == (SERVICE_USER, SERVICE_USER, 0o600), suffix
    assert owner_group_mode(board.socket) == (SERVICE_USER, MEMBERS_GROUP, 0o660)
    assert stat.S_ISSOCK(os.lstat(board.socket).st_mode)
    assert owner_group_mode(board.socket.parent) == (SERVICE_USER, SERVICE_USER, 0o755)
    with open(f"/proc/{board.agent.pid}/status") as proc:
        status = dict(line.split(":", 1) for line in proc if ":" in line)
    service = pwd.getpwnam(SERVICE_USER)
    assert status["Uid"].split() == [str(service.pw_uid)] * 4 and status["Gid"].split()[0] == str(service.pw_gid)
    assert int(status["CapEff"], 16) == 1 << 5 and int(status["CapBnd"], 16) & (1 << 5)  # CAP_KILL


@pytest.mark.parametrize("user", ["bob", "carol", "mallory"])
def test_members_and_admins_cannot_open_the_database_file_at_all(board, user):
    board.book("alice", "1", "--for", "1h")
    paths = [str(board.db), f"{board.db}-wal", f"{board.db}-shm"]
    result = board.run(user, *paths, program=[sys.executable, "-c", OPEN_DB])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:3] == [f"{path} EACCES" for path in paths], result.stdout
    assert lines[3].startswith("sqlite: unable to open database file"), lines[3]
    sqlite = board.run(user, str(board.db), "SELECT count(*) FROM bookings", program=["sqlite3"])
    assert sqlite.returncode != 0 and "unable to open" in sqlite.stderr.lower(), (sqlite.stdout, sqlite.stderr)
    assert sqlite.stdout == ""
    # A board that names the file itself (BOARD_DB) cannot open it either: one line, no traceback.
    direct = board.run(user, "list", env={"BOARD_DB": str(board.db)})
    assert direct.returncode != 0 and "Traceback" not in direct.stderr and len(direct.stderr.splitlines()) == 1


# -- two members ----------------------------------------------------------------------------


def test_alice_and_bob_both_book_and_each_sees_the_other_at_once(board):
    bob_watches = spawn(board, "bob", WATCH)
    started = time.monotonic()
    mine = board.book("alice", "2", "--for", "2h", "--note", "alice's sweep")
    seen = json.loads(bob_watches.communicate(timeout=30)[0].strip())
    lag = time.monotonic() - started
    assert [mine["id"], "alice", mine["cards"]] in seen
    assert lag < 5, f"bob's subscription saw alice's booking only after {lag:.1f} s"

    alice_watches = spawn(board, "alice", WATCH)
    theirs = board.book("bob", "2", "--for", "2h", "--note", "bob's eval")
    seen = json.loads(alice_watches.communicate(timeout=30)[0].strip())
    assert [theirs["id"], "bob", theirs["cards"]] in seen
    assert not set(mine["cards"]) & set(theirs["cards"])

    for viewer in ("alice", "bob"):
        listed = board.json(viewer, "list")["bookings"]
        assert [(b["id"], b["user"], b["note"]) for b in listed] == [
            (mine["id"], "alice", "alice's sweep"), (theirs["id"], "bob", "bob's eval")]
        holders = {c["index"]: c["booking"]["user"] for c in board.json(viewer, "status")["cards"] if c["booking"]}
        assert holders == {**{i: "alice" for i in mine["cards"]}, **{i: "bob" for i in theirs["cards"]}}

    # The real UIDs, from the kernel (SO_PEERCRED), in the service's own file.
    alice, bob = pwd.getpwnam("alice").pw_uid, pwd.getpwnam("bob").pw_uid
    assert board.rows("SELECT user, uid, created_by FROM bookings ORDER BY id") == [
        ("alice", alice, alice), ("bob", bob, bob)]


# -- roles ----------------------------------------------------------------------------------


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
    # A booking under way is split at now (its past stays on the old cards): the rest has its own id.
    given = board.json("carol", "admin", "reassign", str(moved["id"]), "--user", "bob")
    assert given["user"] == "bob"
    assert board.json("carol", "extend", str(future["id"]), "--for", "30m")["id"] == future["id"]
    assert board.json("carol", "cancel", str(future["id"]))["status"] == "cancelled"
    assert board.json("carol", "release", str(given["id"]))["id"] == given["id"]
    done = [e for e in board.log() if e["uid"] == carol and e["ok"]]
    assert sorted(e["action"] for e in done) == ["cancel", "extend", "extend", "reassign", "reassign", "release"]
    assert (given["id"], "bob", bob) in board.rows("SELECT id, user, uid FROM bookings")
    # The chain verifies after all of it (doctor, as root, reads the service's file).
    doctor = board.run("root", "doctor")
    assert "audit chain intact" in doctor.stdout and "integrity: ok" in doctor.stdout, doctor.stdout
    assert doctor.returncode == 0 and "FIX" not in doctor.stdout, doctor.stdout  # one owner, 0700/0600, no links


def test_admin_comes_from_the_services_config_not_the_default(board):
    board.stop_agent()
    board.config.write_text(config_text(board.prefix, admin_group="board-no-such-group"))
    board.start_agent()
    assert board.json("carol", "whoami")["admin"] is False
    booking = board.book("alice", "1", "--for", "1h")
    assert board.run("carol", "cancel", str(booking["id"])).returncode == 4


@pytest.mark.parametrize("via", ["setpriv", "runuser"])
def test_user_logname_and_sudo_user_change_nothing(board, via):
    alice, bob = pwd.getpwnam("alice").pw_uid, pwd.getpwnam("bob").pw_uid
    booking = board.book("alice", "1", "--for", "1h")
    spoof = {"USER": "alice", "LOGNAME": "alice", "USERNAME": "alice", "SUDO_USER": "alice",
             "SUDO_UID": str(alice), "SUDO_GID": str(alice)}
    who = board.json("bob", "whoami", env=spoof, via=via)
    assert (who["user"], who["uid"], who["admin"]) == ("bob", bob, False)
    result = board.run("bob", "cancel", str(booking["id"]), env=spoof, via=via)
    assert result.returncode == 4 and "belongs to alice" in one_line(result)
    mine = board.book("bob", "1", "--for", "1h", env=spoof, via=via)
    assert mine["user"] == "bob"
    as_root = {"USER": "root", "LOGNAME": "root", "SUDO_USER": "root", "SUDO_UID": "0", "SUDO_GID": "0"}
    assert board.json("bob", "whoami", env=as_root, via=via)["admin"] is False
    assert board.run("bob", "admin", "reassign", str(booking["id"]), "--user", "bob", env=as_root, via=via).returncode == 4
    assert board.rows("SELECT user, uid FROM bookings WHERE id = ?", mine["id"]) == [("bob", bob)]
    actors = board.rows("SELECT DISTINCT actor, uid FROM events WHERE actor != 'alice'")
    assert actors == [("bob", bob)]


def _window(center: datetime, before_min: int = 60, after_min: int = 180) -> str:
    start, end = center - timedelta(minutes=before_min), center + timedelta(minutes=after_min)
    return f"{start:%H:%M}-{end:%H:%M}"


def test_bobs_own_config_tz_and_user_change_nothing_he_may_do(make_board):
    """Policy, pools, windows and the admin group are the service's; bob's BOARD_CONFIG, TZ and USER only display."""
    now = datetime.now(UTC)
    shanghai = now + timedelta(hours=8)  # Asia/Shanghai has no DST
    board = make_board(
        '\n[[pools]]\nname = "shanghai-day"\ncards = [4, 5]\n'
        f'[pools.windows]\nfinetune = {{ hours = "{_window(shanghai)}", weekends = false }}\n'
        '\n[[pools]]\nname = "utc-now"\ncards = [6, 7]\n'
        f'[pools.windows]\nfinetune = {{ hours = "{_window(now)}", weekends = false }}\n',
        TZ="UTC")  # the service's zone: [policy] timezone is unset, so the system's, here UTC
    alices = board.book("alice", "--cards", "0", "--for", "2h")
    bob_home = board.home("bob")
    mine = bob_home / "mine.toml"
    mine.write_text(f'[storage]\ndb = "{bob_home}/own.db"\n\n[service]\nsocket = "{board.socket}"\ngroup = "bob"\n\n'
                    f'[access]\nadmin_group = "bob"\n\n[policy]\nmax_booking_hours = 100000\nmax_cards_per_user = 8\n')
    os.chmod(mine, 0o644)
    disguise = {"BOARD_CONFIG": str(mine), "TZ": "Asia/Shanghai", "USER": "carol", "LOGNAME": "carol"}

    for env in ({}, disguise):
        who = board.json("bob", "whoami", env=env)
        assert (who["user"], who["admin"]) == ("bob", False), env
        for args in (["admin", "reassign", str(alices["id"]), "--user", "bob"], ["cancel", str(alices["id"])]):
            result = board.run("bob", *args, env=env)
            assert result.returncode == 4, (env, args, result.stderr)
            one_line(result)
        # The window that is open now in Shanghai, not here (the service's zone): refused.
        day = board.run("bob", "book", "--cards", "4", "--for", "1h", "--class", "finetune", env=env)
        assert day.returncode == 4 and "only" in one_line(day) and "shanghai-day" in day.stderr, (env, day.stderr)
        # The service's policy, not bob's: at most 72 h.
        long = board.run("bob", "book", "--cards", "3", "--for", "100h", env=env)
        assert long.returncode == 4 and "72" in one_line(long), (env, long.stderr)
    # The window open now in the service's zone (closed in Shanghai): granted, once, whatever bob's TZ says.
    night = board.book("bob", "--cards", "6", "--for", "1h", "--class", "finetune", env=disguise)
    assert night["user"] == "bob" and night["cards"] == [6]
    assert [(b["id"], b["user"]) for b in board.json("carol", "list")["bookings"]] == [
        (alices["id"], "alice"), (night["id"], "bob")]
    bob = pwd.getpwnam("bob").pw_uid
    refused = refused_events(board, bob)
    assert sorted(e["action"] for e in refused if e["booking_id"] == alices["id"]) == ["cancel", "cancel", "reassign",
                                                                                        "reassign"]
    assert {e["actor"] for e in board.log() if e["uid"] == bob} == {"bob"}
    assert not (bob_home / "own.db").exists()


# -- outsiders ------------------------------------------------------------------------------


OUTSIDER_COMMANDS = [
    ["status"], ["list"], ["list", "--json"], ["book", "1", "--for", "1h"], ["cancel", "1"], ["log"],
    ["extend", "1", "--for", "1h"], ["whoami"], ["run", "--", "true"],
]


@pytest.mark.parametrize("args", OUTSIDER_COMMANDS, ids=lambda a: "-".join(a))
def test_mallory_gets_one_clear_line(board, args):
    result = board.run("mallory", *args)
    assert result.returncode == 4, result.stderr
    line = one_line(result)
    assert "no access to the board" in line and "ask an admin to add you to" in line, line
    assert result.stdout == ""


def test_mallory_is_refused_by_the_service_itself_even_when_the_socket_is_open(board):
    booking = board.book("alice", "1", "--for", "1h")
    os.chmod(board.socket, 0o666)  # a mistake: the service still checks membership from SO_PEERCRED
    for args in (["status"], ["list", "--json"], ["whoami"]):  # reads: see the next test for writes
        result = board.run("mallory", *args)
        assert result.returncode == 4, (args, result.stderr)
        assert f"ask an admin to add you to group {MEMBERS_GROUP}" in one_line(result)
        assert result.stdout == ""
    for args in (["book", "1", "--for", "1h"], ["cancel", str(booking["id"])], ["run", "--", "true"]):
        result = board.run("mallory", *args)
        assert result.returncode in (1, 4) and "Traceback" not in result.stderr, (args, result.stderr)
    assert [b["id"] for b in board.json("alice", "list")["bookings"]] == [booking["id"]]
    mallory = pwd.getpwnam("mallory").pw_uid
    assert board.rows("SELECT count(*) FROM events WHERE uid = ?", mallory) == [(0,)]
    assert board.rows("SELECT count(*) FROM bookings WHERE uid = ?", mallory) == [(0,)]


SLOW_OUTSIDER = """
import json, socket, sys, time
sock = socket.socket(socket.AF_UNIX)
sock.connect(sys.argv[1])
time.sleep(0.5)  # a client that is slow to send its first request (a loaded machine)
try:
    sock.sendall(b'{"v": 1, "id": 7, "op": "book", "args": {"count": 1, "start": 0, "end": 1}}\\n')
    sent = "sent"
except OSError as error:
    sent = type(error).__name__
print(sent, sock.makefile("rb").readline().decode().strip())
"""


def test_a_slow_outsider_is_refused_at_once_unread_and_still_finds_the_refusal(board):
    """The door reads nothing from a refused client (issue 17: a refusal costs no thread and no wait), so
    the request meets a closed socket; the one line of refusal is still there to read."""
    os.chmod(board.socket, 0o666)
    result = board.run("mallory", str(board.socket), program=[sys.executable, "-c", SLOW_OUTSIDER])
    sent, reply = result.stdout.split(" ", 1)
    reply = json.loads(reply)
    assert reply["error"]["code"] == 4 and MEMBERS_GROUP in reply["error"]["message"]
    # Its request met a closed socket (or, on a machine too busy to refuse within 0.5 s, went unread).
    assert sent in ("BrokenPipeError", "sent") and reply["id"] is None, result.stdout


def test_a_killed_service_says_so_in_one_line_and_keeps_what_it_acknowledged(board):
    booking = board.book("alice", "1", "--for", "1h")
    board.agent.kill()  # kill -9: the socket file stays behind
    board.agent.wait(timeout=10)
    assert board.socket.exists()
    result = board.run("alice", "list")
    assert result.returncode == 1
    assert "the board service is not running (systemctl status board-agent)" in one_line(result)
    board.start_agent()  # the stale socket is replaced
    assert [b["id"] for b in board.json("bob", "list")["bookings"]] == [booking["id"]]
