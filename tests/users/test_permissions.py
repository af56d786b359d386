"""Every permission check, through the real CLI, as real Unix users, against the real agent.

The checks in app/: where; who may; the refusal (exit 4, code 4 on the wire); how it is audited.
[cli] marks what this module runs through the CLI; [socket] what tests/service/test_service_permissions.py
runs as client calls from processes of those users (and [local] in process, identities given).

 1. service/bookings.py BookingService._editable (cancel, release, extend, and reassign after 2) [cli socket local]
    the holder (booking.uid, not the name) or an admin
    "booking N belongs to X; only they or an admin can VERB it"; audited VERB, ok=0
 2. service/bookings.py BookingService.reassign [cli socket local]
    admins only, not even the holder; "only admins (group G) can reassign bookings"; audited reassign, ok=0
 3. service/enforce.py run_booking (op `run`; `register` kind job, which `board run` sends) [cli socket local]
    the holder only: admins are refused too; none named: only the caller's own active booking
    "booking N belongs to X; run on your own booking" / "you have no active booking"; audited run, ok=0
 4. llama/service.py ServerService._may_start (serve_start; again under the write lock in _lease) [cli socket local]
    the holder only; "booking N belongs to X; only its holder can start a server on it"; audited server-start, ok=0
 5. llama/service.py ServerService.stop (serve_stop; the enforcer passes enforce=True) [cli socket local]
    the server's holder or an admin; "server N belongs to X; only they or an admin can stop it";
    audited server-stop, ok=0 (local: only the refusal; an allowed stop there waits 15 s for a supervisor)
 6. service/servers.py serve_registration (`register` kind server, a supervisor) [socket]
    the row's holder, on her own active booking, by the peer's uid: admins too are refused
    "server N belongs to X" / "booking N is not yours and active now"; audited server-register, ok=0
 7. service/servers.py serve_logs [socket cli]: the log file's path only for the server's holder (null for others);
    serve_get, serve_list, serve_start and serve_stop blank it ("") for everyone else. Its lines (and a row's
    log_tail) for the holder and admins only (llama/service.py ServerService.holder_or_admin): "server N belongs
    to X; only they or an admin can read its log"; audited server-logs, ok=0 (cli: tests/users/test_llama_users.py)
 8. service/server.py ServiceServer._admit, peer.py is_member [cli socket]
    uid 0, the service's own uid, or a process in the members' or the admin group
    "no access to the board: ask an admin to add you to group G"; not audited (nothing is written);
    a SocketClient refused there is refused again on its next request, a write too (the door never read it)
 9. client/socket.py SocketClient.connect [cli socket]: the kernel, by the socket's mode (0660, group G)
    "no access to the board service at PATH; ask an admin to add you to group G"
10. service/peer.py identity_of [cli socket]: admin = uid 0, or the admin gid among the groups of the peer
    *process* (/proc/PID/status), not of its account
11. service/processes.py Registry.add: the registering pid (SO_PEERCRED) runs under the peer's uid;
    "the registering process is not yours"; audited run, ok=0 (tests/users/test_jobs.py, a forged registration)
12. service/hub.py Hub.publish(uid=): a reassign's `notice` reaches only the holders before and after [socket]
13. llama/service.py ServerService.api_key (serve_key) [cli]: the server's holder or an admin;
    "server N belongs to X; only they or an admin can read its key"; audited server-key, ok=0
14. service/plans.py create, cancel (serve_plan, serve_plan_cancel) [cli local]: the booking's or series' holder;
    cancel also an admin; audited server-plan, ok=0
15. service/plans.py runner_registration (`register` kind runner) [cli]: only the uid of [llama] runner_user
16. service/servers.py may_supervise, _resumed [socket]: a supervisor of the runner's uid only for a server a plan
    started; a `resume` only from the very process recorded (pid, start time, command line) under a uid that may
    supervise it; audited server-register, ok=0
17. core/policy.py class_refusal ([classes]), through BookingService._check_access (book, plan, next_free, slots,
    series_book and series_extend, reassign's new holder) and op key_new (a key's class, and its default)
    [socket local]: the holder, named or in an @group of the system's group database, whoever asks; a class not
    named is everyone's; "X may not use class C: it is for WHO ([classes] in the service's config); use ...";
    audited create / series / series_extend / reassign / key_new, ok=0
18. service/ops/gateway.py key_new [socket local]: at most [gateway] max_keys_per_user live keys issued by the
    holder themselves; keys an admin issues for another account are apart; audited key_new, ok=0
19. admins only: move (not even the holder), earliest under another user's limits, series_book/series_extend with
    override_policy, power_step, notify_test and notify_status, key_new for another account; the holder or an admin:
    series_extend, series_cancel, key_revoke ("no key N of yours", exit 2, not audited), serve_key, serve_logs,
    serve_plan_cancel; key_list `all` is everyone's for admins only; a per-user alert is its user's alone
20. service/ops/gateway.py _gateway_only (gateway_state, gateway_usage, and service/ops/models.py model_demand,
    models_touch): the [gateway] user's account or root, admins refused; llama/aliases.py: a catalog alias
    ([[models]]) is served by the runner's account alone, exit 3 (tests/service/test_on_demand_service.py);
    service/servers.py may_supervise: the runner's account supervises only what a plan started
(13-16: tests/llama/test_servers_service.py and tests/unit/test_plans.py; 17-18: tests/service/test_classes.py;
13-14 and 19-20 from both sides, as one table: tests/service/test_admin_operations.py [socket local].)

Not identity checks, left to their own tests: a lost card (bookings.py _check_cards), the policy
limits (core/policy.py), a host the config does not allow (llama/service.py), a booking that is
cancelled or not active, exec permission (cli.py cmd_run), opening the service's database file
(store/db.py; tests/users/test_sharing.py).

One agent serves the whole module (with a stand-in llama-server that answers /health, as in
test_llama_users.py); after each test, root (an admin) ends every live booking and server, so each
test starts on a free fleet.
"""

from __future__ import annotations

import ctypes
import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest

from tests.agent_process import SETPRIV
from tests.ports import port_range
from tests.shared_install import SharedInstall, make_layout, scratch_dir
from tests.unix_users import ADMIN_GROUP, MEMBERS_GROUP, REPO
from tests.users.conftest import config_text
from tests.users.test_llama_users import reap, write_stand_ins


PR_SET_CHILD_SUBREAPER = 36


def uid(user: str) -> int:
    return pwd.getpwnam(user).pw_uid


@pytest.fixture(scope="module")
def shared(unix_users):
    """One shared install for the module: its agent as the unit runs it, a stand-in llama-server and a model."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
    root = scratch_dir("board-permissions-")
    server_bin, model = write_stand_ins(root)
    port_min, port_max = port_range("permissions", 20)
    prefix = root / "prefix"
    make_layout(prefix, config_text(prefix, extra=f'\n[llama]\nserver_bin = "{server_bin}"\nport_min = {port_min}\n'
                                                  f'port_max = {port_max}\nready_timeout_s = 30\n'))
    board = SharedInstall(root=root, prefix=prefix)
    board.model = model
    board.start_agent()
    yield board
    board.stop_agent()
    reap()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def free_fleet(shared):
    """After each test, root ends every live server and booking (root is admin), so the next starts on a free fleet."""
    yield
    from app.client.socket import SocketClient
    from app.errors import BadInput
    from app.llama import launch

    client = SocketClient(str(shared.socket))
    try:
        for server in client.call("serve_list"):
            launch.stop(client, server["id"])
        for booking in client.call("list", start=int(time.time()))["bookings"]:
            try:
                client.call("release", id=booking["id"])
            except BadInput:  # not started yet
                client.call("cancel", id=booking["id"])
    finally:
        client.close()
        reap()


# -- what a refusal must say, and leave alone --------------------------------------------------------


def refused(result: subprocess.CompletedProcess, *words: str) -> str:
    """Exit 4, nothing on stdout, one line on stderr that contains `words`; returns the message."""
    assert result.returncode == 4, (result.returncode, result.stderr)
    assert result.stdout == "", result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("board: ") and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0].removeprefix("board: ")


def written(board: SharedInstall) -> tuple:
    """What a refused request must leave as it was: bookings, their cards, the servers and their states.
    (Not the jobs table: the service forgets an ended job whenever its sweep comes round.)"""
    return (board.rows("SELECT * FROM bookings ORDER BY id"),
            board.rows("SELECT * FROM booking_cards ORDER BY booking_id, card_uuid"),
            board.rows("SELECT id, booking_id, user, uid, state FROM servers ORDER BY id"))


def last_event(board: SharedInstall) -> int:
    return board.rows("SELECT coalesce(max(id), 0) FROM events")[0][0]


def events_since(board: SharedInstall, mark: int) -> list[tuple]:
    """(uid, actor, action, booking_id, ok, details) of each event after `mark`, oldest first."""
    return [(*row[:4], bool(row[4]), json.loads(row[5])) for row in board.rows(
        "SELECT uid, actor, action, booking_id, ok, details FROM events WHERE id > ? ORDER BY id", mark)]


def audited_refusals(board: SharedInstall, mark: int) -> list[tuple]:
    """(actor, uid, action, booking_id) of each refusal after `mark`; every one carries its message."""
    found = events_since(board, mark)
    assert all(not ok and details["refused"] for *_, ok, details in found), found
    return [(actor, who, action, booking) for who, actor, action, booking, _, _ in found]


def when(text: str) -> datetime:
    return datetime.fromisoformat(text)


# -- bookings: the holder or an admin ------------------------------------------------------------------

def under_way() -> list[str]:
    """A booking that started half a minute ago (inside the grace for a start in the past), never this second."""
    start = datetime.now(UTC) - timedelta(seconds=30)
    return ["--start", f"{start:%Y-%m-%dT%H:%M:%S}Z", "--for", "1h"]


# Each case its own card: a booking ended by the cleanup keeps its past up to now, which a booking
# that started half a minute ago on the same card would overlap.
CASES = [("cancel", "alice", 7), ("cancel", "carol", 7), ("release", "alice", 0), ("release", "carol", 1),
         ("extend", "alice", 2), ("extend", "carol", 3)]


@pytest.mark.parametrize("verb, allowed, card", CASES, ids=[f"{v}-{'holder' if a == 'alice' else 'admin'}"
                                                           for v, a, _ in CASES])
def test_only_the_holder_or_an_admin_changes_a_booking(shared, verb, allowed, card):
    span = ["--start", "+3h", "--for", "1h"] if verb == "cancel" else under_way()
    booking = shared.book("alice", "--cards", str(card), *span)
    extra = ["--for", "30m"] if verb == "extend" else []
    args = [verb, str(booking["id"]), *extra]
    before, mark = written(shared), last_event(shared)

    message = refused(shared.run("bob", *args), f"booking {booking['id']} belongs to alice",
                      f"only they or an admin can {verb} it")
    assert written(shared) == before
    [event] = events_since(shared, mark)
    assert event[:5] == (uid("bob"), "bob", verb, booking["id"], False) and event[5]["refused"] == message

    mark = last_event(shared)
    done = shared.json(allowed, *args)
    assert (done["id"], done["user"], done["cards"]) == (booking["id"], "alice", [card])
    if verb == "cancel":
        assert done["status"] == "cancelled"
    elif verb == "release":
        assert done["status"] == "booked" and when(done["end"]) < when(booking["end"])
    else:
        assert when(done["end"]) == when(booking["end"]) + timedelta(minutes=30)
    [event] = events_since(shared, mark)
    assert event[:5] == (uid(allowed), allowed, verb, booking["id"], True)


def test_only_admins_reassign_not_even_the_holder_and_the_new_holder_then_owns_it(shared):
    booking = shared.book("alice", "--cards", "2", "--start", "+2h", "--for", "1h")  # not started: moves whole
    number = str(booking["id"])
    before, mark = written(shared), last_event(shared)
    attempts = [("bob", "--cards", "3"), ("bob", "--user", "bob"), ("alice", "--cards", "3"), ("alice", "--user", "bob")]
    for user, *change in attempts:
        refused(shared.run(user, "admin", "reassign", number, *change),
                f"only admins (group {ADMIN_GROUP}) can reassign bookings")
    assert written(shared) == before
    assert audited_refusals(shared, mark) == [(user, uid(user), "reassign", booking["id"]) for user, *_ in attempts]

    mark = last_event(shared)
    moved = shared.json("carol", "admin", "reassign", number, "--cards", "3")
    assert (moved["id"], moved["user"], moved["cards"]) == (booking["id"], "alice", [3])
    given = shared.json("carol", "admin", "reassign", number, "--user", "bob")
    assert (given["id"], given["user"], given["cards"]) == (booking["id"], "bob", [3])
    assert shared.rows("SELECT user, uid, created_by FROM bookings WHERE id = ?", booking["id"]) == [
        ("bob", uid("bob"), uid("alice"))]
    assert [e[:5] for e in events_since(shared, mark)] == [(uid("carol"), "carol", "reassign", booking["id"], True)] * 2

    # The holder is who the row says now: alice no longer may, bob may.
    refused(shared.run("alice", "cancel", number), f"booking {number} belongs to bob")
    assert shared.json("bob", "cancel", number)["status"] == "cancelled"


# -- board run: the holder alone ------------------------------------------------------------------------


def test_board_run_runs_only_on_your_own_booking_and_not_for_admins_either(shared):
    booking = shared.book("alice", "--cards", "4", "--for", "1h")
    number = str(booking["id"])
    before, mark = written(shared), last_event(shared)
    for user in ("bob", "carol"):
        refused(shared.run(user, "run", "--booking", number, "--", "true"),
                f"booking {number} belongs to alice; run on your own booking")
    # Naming none: bob holds no booking, and alice's active one is not his to take.
    refused(shared.run("bob", "run", "--", "true"), "you have no active booking")
    assert written(shared) == before
    assert shared.rows("SELECT count(*) FROM jobs WHERE booking_id = ?", booking["id"]) == [(0,)]
    assert audited_refusals(shared, mark) == [
        ("bob", uid("bob"), "run", booking["id"]), ("carol", uid("carol"), "run", booking["id"]),
        ("bob", uid("bob"), "run", None)]

    mark = last_event(shared)
    ran = shared.run("alice", "run", "--booking", number, "--", "sh", "-c", 'echo "$BOARD_BOOKING_ID $(id -un)"')
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == [number, "alice"]
    [event] = events_since(shared, mark)
    assert event[:5] == (uid("alice"), "alice", "run", booking["id"], True)


# -- llama-server: the holder starts; the holder or an admin stops ---------------------------------------


def test_only_the_holder_starts_a_server_and_only_she_or_an_admin_stops_it(shared):
    booking = shared.book("alice", "--cards", "5", "--for", "1h")
    number = str(booking["id"])

    def start() -> dict:
        result = shared.run("alice", "serve", "start", number, "--model", str(shared.model), "--ctx", "256", "--json")
        assert result.returncode == 0, result.stderr
        server = json.loads(result.stdout)
        assert (server["user"], server["state"]) == ("alice", "ready"), server
        return server

    server = start()
    before, mark = written(shared), last_event(shared)
    refused(shared.run("bob", "serve", "stop", str(server["id"])),
            f"server {server['id']} belongs to alice; only they or an admin can stop it")
    for user in ("bob", "carol"):  # an admin may stop it, but not start one on someone else's booking
        refused(shared.run(user, "serve", "start", number, "--model", str(shared.model)),
                f"booking {number} belongs to alice; only its holder can start a server on it")
    assert written(shared) == before
    assert audited_refusals(shared, mark) == [
        ("bob", uid("bob"), "server-stop", booking["id"]), ("bob", uid("bob"), "server-start", booking["id"]),
        ("carol", uid("carol"), "server-start", booking["id"])]
    assert [(s["id"], s["state"]) for s in shared.json("bob", "serve", "list")["servers"]] == [(server["id"], "ready")]

    mark = last_event(shared)
    assert shared.json("carol", "serve", "stop", str(server["id"]))["state"] == "stopped"
    again = start()
    assert shared.json("alice", "serve", "stop", str(again["id"]))["state"] == "stopped"
    stops = [e[:5] for e in events_since(shared, mark) if e[2] == "server-stop"]
    assert stops == [(uid("carol"), "carol", "server-stop", booking["id"], True),
                     (uid("alice"), "alice", "server-stop", booking["id"], True)]


# -- who gets in, and who is an admin: the peer process's groups -----------------------------------------


def as_process(board: SharedInstall, user: str, groups: list[str], *args: str) -> subprocess.CompletedProcess:
    """`board ARGS` as `user` in a process whose supplementary groups are exactly `groups`, not the account's."""
    entry = pwd.getpwnam(user)
    chosen = [f"--groups={','.join(groups)}"] if groups else ["--clear-groups"]
    return subprocess.run([SETPRIV, f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", *chosen, "--",
                           sys.executable, "-m", "app", *args], capture_output=True, text=True,
                          env=board.environ(user), cwd=REPO, timeout=60)


def test_a_non_member_is_refused_at_the_door_and_groups_are_the_processes_own(shared):
    booking = shared.book("alice", "--cards", "6", "--start", "+1h", "--for", "1h")
    before, mark = written(shared), last_event(shared)
    # The socket's mode keeps mallory out before the service sees him.
    refused(shared.run("mallory", "whoami"), f"no access to the board service at {shared.socket}",
            f"add you to group {MEMBERS_GROUP}")
    os.chmod(shared.socket, 0o666)  # a mistake: the service's own check still holds
    try:
        door = f"no access to the board: ask an admin to add you to group {MEMBERS_GROUP}"
        for args in (["whoami"], ["list"], ["book", "1", "--for", "1h"], ["cancel", str(booking["id"])],
                     ["run", "--", "true"]):
            refused(shared.run("mallory", *args), door)
        # carol's account is in both groups; a process of hers that dropped them is not let in ...
        refused(as_process(shared, "carol", [], "whoami"), door)
        # ... and one in the admin group alone is, as an admin.
        alone = as_process(shared, "carol", [ADMIN_GROUP], "whoami", "--json")
        assert alone.returncode == 0, alone.stderr
        assert (json.loads(alone.stdout)["user"], json.loads(alone.stdout)["admin"]) == ("carol", True)
    finally:
        os.chmod(shared.socket, 0o660)
    assert written(shared) == before and events_since(shared, mark) == []  # refusals at the door write nothing

    # A process of carol's without the admin group is a member, not an admin.
    member = as_process(shared, "carol", [MEMBERS_GROUP], "whoami", "--json")
    assert member.returncode == 0, member.stderr
    assert json.loads(member.stdout)["admin"] is False
    refused(as_process(shared, "carol", [MEMBERS_GROUP], "admin", "reassign", str(booking["id"]), "--cards", "7"),
            f"only admins (group {ADMIN_GROUP}) can reassign bookings")
    refused(as_process(shared, "carol", [MEMBERS_GROUP], "cancel", str(booking["id"])),
            f"booking {booking['id']} belongs to alice")
    assert written(shared) == before
    assert audited_refusals(shared, mark) == [("carol", uid("carol"), "reassign", booking["id"]),
                                              ("carol", uid("carol"), "cancel", booking["id"])]
