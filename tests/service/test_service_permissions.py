"""The permission checks as client calls, each made by a different user, in process and through the socket.

The checks are listed (where, who may, the refusal, how it is audited) in the docstring of
tests/users/test_permissions.py, which runs them through the real CLI; here they are the
operations themselves, `call(op, **args)`, on both transports:

- local: one Service in this process on a database file of its own (the simulated fleet), and a
  LocalClient per identity (alice and bob members, carol admin): the rules alone.
- socket: the real agent as the unit runs it (members' group boardusers, admin group boardadmins).
  Each user is a process of their own, started with setpriv with the account's real groups, that
  makes SocketClient calls for the test, one JSON line each way: the service knows the caller only
  from SO_PEERCRED and /proc. Registrations and subscriptions are processes of their own too.

Both share one service per module; after each test root (an admin) ends every live booking. What
only the socket has (registrations, the door, groups of the peer process, notices) runs there alone.
"""

from __future__ import annotations

import json
import os
import pwd
import queue
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from app.errors import BadInput, NotPermitted, error_for
from tests import agent_process
from tests.agent_process import SETPRIV
from tests.service.support import REPO, SERVICE_USER, Agent, check_reachable, ensure_outsider, needs_root
from tests.shared_install import scratch_dir, read_rows
from tests.unix_users import ADMIN_GROUP, MEMBERS_GROUP
from tests.users.conftest import unix_users  # noqa: F401 - the users, as tests/users has them

pytestmark = pytest.mark.real_users  # real Unix users (root); skipped with the reason otherwise

HOUR = 3600
MODEL = "/models/never-opened.gguf"  # the service takes it as text; nothing here launches a server
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TZ": "UTC", "HOME": "/", "PYTHONDONTWRITEBYTECODE": "1"}


def uid(user: str) -> int:
    return pwd.getpwnam(user).pw_uid


def privileges(user: str, groups: list[str] | None) -> list[str]:
    """setpriv to `user`, with the account's groups (None) or exactly `groups`."""
    entry = pwd.getpwnam(user)
    chosen = ["--init-groups"] if groups is None else [f"--groups={','.join(groups)}"] if groups else ["--clear-groups"]
    return [SETPRIV, f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", *chosen, "--"]


# -- callers ------------------------------------------------------------------------------------------

CALLER = """
import json, sys
from app.client.socket import SocketClient
from app.errors import BoardError
client = SocketClient(sys.argv[1])
for line in sys.stdin:
    op, args = json.loads(line)
    try:
        reply = {"result": client.call(op, **args)}
    except BoardError as error:
        reply = {"code": error.exit_code, "message": str(error)}
    print(json.dumps(reply), flush=True)
"""

# One stream (register, subscribe) from a process of its own: the first reply, then each event, as JSON lines.
STREAM = """
import json, sys
from app.client.socket import SocketClient
from app.errors import BoardError
try:
    sock, reader, result = SocketClient(sys.argv[1]).stream(sys.argv[2], json.loads(sys.argv[3]))
except BoardError as error:
    print(json.dumps({"code": error.exit_code, "message": str(error)}), flush=True)
    sys.exit(0)
print(json.dumps({"result": result}), flush=True)
for line in reader:
    sys.stdout.write(line.decode())
    sys.stdout.flush()
"""


def answer(line: str, stderr: str = "") -> Any:
    assert line, f"the caller died: {stderr}"
    reply = json.loads(line)
    if "code" in reply:
        raise error_for(reply["code"], reply["message"])
    return reply["result"]


class Remote:
    """A SocketClient in a process of `user`'s own; call() as on any client."""

    transport = "socket"

    def __init__(self, user: str, socket: Path, groups: list[str] | None = None) -> None:
        self.proc = subprocess.Popen([*privileges(user, groups), sys.executable, "-c", CALLER, str(socket)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=ENV, cwd=REPO)

    def call(self, op: str, **args: Any) -> Any:
        self.proc.stdin.write(json.dumps([op, args]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        return answer(line, "" if line else self.proc.stderr.read())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


class Stream:
    """`op` (register, subscribe) on a connection of its own, from a process of `user`'s that leads its own group."""

    def __init__(self, user: str, socket: Path, op: str, args: dict, groups: list[str] | None = None) -> None:
        self.proc = subprocess.Popen([*privileges(user, groups), sys.executable, "-c", STREAM, str(socket), op,
                                      json.dumps(args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=ENV, cwd=REPO, start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")

    def first(self) -> Any:
        """The service's answer to the request: its result, or the error it stands for."""
        return answer(self.next_line(), "")

    def next_line(self, timeout: float = 30.0) -> str:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"nothing from the {self.proc.args[-2]} stream within {timeout:g} s") from None

    def next_event(self, kind: str) -> dict:
        while True:
            line = self.next_line()
            assert line, f"the stream ended: {self.proc.stderr.read()}"
            event = json.loads(line)
            if event.get("event") == kind:
                return event

    def close(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(timeout=30)


# -- the two worlds -------------------------------------------------------------------------------------


@dataclass
class World:
    transport: str
    db: Path
    root: Any  # an admin's client (uid 0): reads the log, ends bookings after each test
    callers: dict[str, Any] = field(default_factory=dict)
    agent: Agent | None = None

    def __getitem__(self, user: str):
        return self.callers[user]

    def rows(self, sql: str, *params) -> list[tuple]:
        return read_rows(self.db, sql, *params)

    def written(self) -> tuple:
        """What a refusal must leave as it was: bookings, their cards, which servers exist and whose."""
        return (self.rows("SELECT * FROM bookings ORDER BY id"),
                self.rows("SELECT * FROM booking_cards ORDER BY booking_id, card_uuid"),
                self.rows("SELECT id, booking_id, user, uid FROM servers ORDER BY id"))

    def mark(self) -> int:
        return self.rows("SELECT coalesce(max(id), 0) FROM events")[0][0]

    def events_since(self, mark: int) -> list[tuple]:
        """(actor, uid, action, booking_id, ok, details) after `mark`, oldest first."""
        return [(*row[:4], bool(row[4]), json.loads(row[5])) for row in self.rows(
            "SELECT actor, uid, action, booking_id, ok, details FROM events WHERE id > ? ORDER BY id", mark)]

    def refusals_since(self, mark: int) -> list[tuple]:
        """(actor, uid, action, booking_id) of each event after `mark`, every one a refusal that carries its message."""
        found = self.events_since(mark)
        assert all(not ok and details["refused"] for *_, ok, details in found), found
        return [event[:4] for event in found]

    def book(self, user: str, card: int, start: int, hours: float = 1) -> dict:
        return self[user].call("book", cards=[card], start=start, end=start + int(hours * HOUR))


def config_extra(ports: int) -> str:
    return (f'\n[access]\nadmin_group = "{ADMIN_GROUP}"\n'
            f'\n[llama]\nserver_bin = "/bin/true"\nport_min = {ports}\nport_max = {ports + 19}\n')


def local_world(root: Path, ports: int, extra: str = "") -> World:
    """`extra`: more of the service's config (TOML), as in socket_world."""
    from app.client.local import LocalClient
    from app.config import load_config
    from app.core.identity import Identity
    from app.service import open_service

    db = root / "board.db"
    config_path = root / "board.toml"
    config_path.write_text(f'[storage]\ndb = "{db}"\n' + config_extra(ports) + extra)
    config = load_config(environ={"BOARD_CONFIG": str(config_path)})
    service = open_service(config, demo=None, environ={"BOARD_SIMULATE": "1"})
    world = World("local", db, LocalClient(service, Identity("root", 0, True)))
    for user in ("alice", "bob", "carol"):
        world.callers[user] = LocalClient(service, Identity(user, uid(user), user == "carol"))
    return world


def socket_world(root: Path, ports: int, extra: str = "") -> World:
    ensure_outsider("mallory")
    for user in (SERVICE_USER, "alice", "mallory"):
        check_reachable(user)
    # A long idle timeout: the callers live for the module.
    agent = Agent(root, {"group": MEMBERS_GROUP, "idle_timeout_s": 3600})
    agent.write_config()
    with open(agent.config, "a") as config:
        config.write(config_extra(ports) + extra)
    # `python -m app agent` from this checkout, as tests/users starts it
    agent.proc = agent_process.start([sys.executable, "-m", "app"], agent.config, agent.log)
    agent_process.wait_serving(agent.proc, agent.socket, agent.log)
    world = World("socket", agent.db, agent.client(), agent=agent)
    for user in ("alice", "bob", "carol"):
        world.callers[user] = Remote(user, agent.socket)
    return world


def opened_world(request, prefix: str, first_port: int, extra: str = ""):
    """The module's world of the fixture's param ("local" or "socket"), closed after: a generator for a fixture."""
    needs_root()
    request.getfixturevalue("unix_users")
    root = scratch_dir(prefix)  # user board must reach it
    ports = first_port + (os.getpid() % 300) * 20 + (20 * 300 if request.param == "socket" else 0)
    made = (socket_world if request.param == "socket" else local_world)(root, ports, extra)
    yield made
    for caller in made.callers.values():
        caller.close()
    made.root.close()
    if made.agent is not None:
        assert made.agent.stop() == 0, made.agent.log_text()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module", params=["local", "socket"])
def world(request):
    yield from opened_world(request, "board-permissions-", 37000)


@pytest.fixture(autouse=True)
def free_fleet(world):
    """After each test root ends every live booking, so the next starts on a free fleet."""
    yield
    for booking in world.root.call("list", start=int(time.time()))["bookings"]:
        try:
            world.root.call("release", id=booking["id"])
        except BadInput:  # not started yet
            world.root.call("cancel", id=booking["id"])


socket_only = pytest.mark.parametrize("world", ["socket"], indirect=True)


def tomorrow(hours: float = 0) -> int:
    """A whole hour about a day ahead."""
    return (int(time.time()) // HOUR + 24) * HOUR + int(hours * HOUR)


def now() -> int:
    return int(time.time())


def under_way() -> int:
    """Half a minute ago (inside the grace for a start in the past): released, it ends as history, never
    cancelled for having started this very second."""
    return int(time.time()) - 30


# -- bookings: the holder or an admin -------------------------------------------------------------------

# A booking ended by the cleanup keeps its past up to now, which one that started half a minute ago on
# the same card would overlap: those (release) have cards of their own. Only they start in the past.
CASES = [("cancel", "alice", 7), ("cancel", "carol", 7), ("release", "alice", 0), ("release", "carol", 1),
         ("extend", "alice", 2), ("extend", "carol", 2)]
STARTS = {"cancel": tomorrow, "release": under_way, "extend": now}


@pytest.mark.parametrize("verb, allowed, card", CASES, ids=[f"{v}-{'holder' if a == 'alice' else 'admin'}"
                                                           for v, a, _ in CASES])
def test_only_the_holder_or_an_admin_changes_a_booking(world, verb, allowed, card):
    booking = world.book("alice", card, STARTS[verb]())
    args = {"id": booking["id"], **({"add_seconds": HOUR // 2} if verb == "extend" else {})}
    before, mark = world.written(), world.mark()

    with pytest.raises(NotPermitted) as refused:
        world["bob"].call(verb, **args)
    assert refused.value.exit_code == 4
    assert str(refused.value) == f"booking {booking['id']} belongs to alice; only they or an admin can {verb} it"
    assert world.written() == before
    [event] = world.events_since(mark)
    assert event[:5] == ("bob", uid("bob"), verb, booking["id"], False) and event[5]["refused"] == str(refused.value)

    mark = world.mark()
    done = world[allowed].call(verb, **args)
    assert (done["id"], done["user"], done["uid"], done["cards"]) == (booking["id"], "alice", uid("alice"), [card])
    if verb == "cancel":
        assert done["status"] == "cancelled"
    elif verb == "release":
        assert done["status"] == "booked" and booking["start"] < done["end"] < booking["end"]
    else:
        assert done["end"] == booking["end"] + HOUR // 2
    assert [e[:5] for e in world.events_since(mark)] == [(allowed, uid(allowed), verb, booking["id"], True)]


def test_only_admins_reassign_not_even_the_holder_and_the_new_holder_then_owns_it(world):
    booking = world.book("alice", 2, tomorrow())  # not started: it moves whole and keeps its id
    before, mark = world.written(), world.mark()
    attempts = [("bob", {"cards": [3]}), ("bob", {"user": "bob"}), ("alice", {"cards": [3]}), ("alice", {"user": "bob"})]
    for user, change in attempts:
        with pytest.raises(NotPermitted, match=f"^only admins \\(group {ADMIN_GROUP}\\) can reassign bookings$"):
            world[user].call("reassign", id=booking["id"], **change)
    assert world.written() == before
    assert world.refusals_since(mark) == [(user, uid(user), "reassign", booking["id"]) for user, _ in attempts]

    mark = world.mark()
    moved = world["carol"].call("reassign", id=booking["id"], cards=[3])
    assert (moved["id"], moved["user"], moved["cards"]) == (booking["id"], "alice", [3])
    given = world["carol"].call("reassign", id=booking["id"], user="bob")
    assert (given["id"], given["user"], given["uid"], given["cards"]) == (booking["id"], "bob", uid("bob"), [3])
    assert [e[:5] for e in world.events_since(mark)] == [("carol", uid("carol"), "reassign", booking["id"], True)] * 2

    # The holder is whom the row names now: alice no longer may, bob may.
    with pytest.raises(NotPermitted, match=f"booking {booking['id']} belongs to bob"):
        world["alice"].call("cancel", id=booking["id"])
    assert world["bob"].call("cancel", id=booking["id"])["status"] == "cancelled"


@pytest.mark.parametrize("world", ["local"], indirect=True)
def test_the_holder_is_a_uid_not_a_name(world):
    """An account named alice with another uid (hers deleted, the name given again) is not her; renamed, she is."""
    from app.client.local import LocalClient
    from app.core.identity import Identity

    booking = world.book("alice", 4, tomorrow())
    # Not closed: closing a LocalClient closes the service it shares with the others.
    namesake = LocalClient(world.root.service, Identity("alice", uid("alice") + 10_000, False))
    with pytest.raises(NotPermitted, match=f"^booking {booking['id']} belongs to alice; only they or an admin"):
        namesake.call("extend", id=booking["id"], add_seconds=HOUR)
    renamed = LocalClient(world.root.service, Identity("alice-renamed", uid("alice"), False))
    assert renamed.call("extend", id=booking["id"], add_seconds=HOUR)["end"] == booking["end"] + HOUR


# -- board run: the holder alone --------------------------------------------------------------------------


def test_run_is_only_on_your_own_booking_and_not_for_admins_either(world):
    booking = world.book("alice", 4, now())
    before, mark = world.written(), world.mark()
    for user in ("bob", "carol"):
        with pytest.raises(NotPermitted, match=f"^booking {booking['id']} belongs to alice; run on your own booking$"):
            world[user].call("run", booking=booking["id"])
    with pytest.raises(NotPermitted, match="you have no active booking"):  # alice's active one is not bob's to take
        world["bob"].call("run")
    assert world.written() == before
    assert world.refusals_since(mark) == [("bob", uid("bob"), "run", booking["id"]),
                                          ("carol", uid("carol"), "run", booking["id"]), ("bob", uid("bob"), "run", None)]
    assert world["alice"].call("run", booking=booking["id"])["id"] == booking["id"]
    assert world["alice"].call("run")["id"] == booking["id"]


@socket_only
def test_a_job_registers_only_on_its_own_booking(world):
    booking = world.book("alice", 5, now())
    mark = world.mark()
    for user in ("bob", "carol"):
        refused = Stream(user, world.agent.socket, "register", {"kind": "job", "booking": booking["id"]})
        with pytest.raises(NotPermitted, match=f"^booking {booking['id']} belongs to alice; run on your own booking$"):
            refused.first()
        refused.close()
    assert world.refusals_since(mark) == [("bob", uid("bob"), "run", booking["id"]),
                                          ("carol", uid("carol"), "run", booking["id"])]
    assert world.rows("SELECT count(*) FROM jobs WHERE booking_id = ?", booking["id"]) == [(0,)]

    job = Stream("alice", world.agent.socket, "register", {"kind": "job", "booking": booking["id"]})
    try:
        assert job.first()["booking"]["id"] == booking["id"]
        assert world.rows("SELECT pid, uid FROM jobs WHERE booking_id = ?", booking["id"]) == [(job.proc.pid, uid("alice"))]
    finally:
        job.close()


# -- llama-server rows: the holder starts, registers and reads the log path; the holder or an admin stops --


def test_only_the_holder_starts_a_server_on_her_booking(world):
    booking = world.book("alice", 5, now())
    before, mark = world.written(), world.mark()
    for user in ("bob", "carol"):
        with pytest.raises(NotPermitted, match=f"^booking {booking['id']} belongs to alice; only its holder can start"):
            world[user].call("serve_start", booking=booking["id"], model=MODEL)
    assert world.written() == before
    assert world.refusals_since(mark) == [("bob", uid("bob"), "server-start", booking["id"]),
                                          ("carol", uid("carol"), "server-start", booking["id"])]
    server = world["alice"].call("serve_start", booking=booking["id"], model=MODEL)["server"]
    assert (server["user"], server["uid"], server["state"]) == ("alice", uid("alice"), "starting")


def test_only_the_holder_or_an_admin_stops_a_server(world):
    booking = world.book("alice", 6, now())
    server = world["alice"].call("serve_start", booking=booking["id"], model=MODEL)["server"]
    before, mark = world.written(), world.mark()
    with pytest.raises(NotPermitted, match=f"^server {server['id']} belongs to alice; only they or an admin can stop it$"):
        world["bob"].call("serve_stop", id=server["id"])
    assert world.written() == before
    assert world["bob"].call("serve_get", id=server["id"])["state"] == "starting"
    assert world.refusals_since(mark) == [("bob", uid("bob"), "server-stop", booking["id"])]
    if world.transport == "local":
        return  # in process an allowed stop waits 15 s for a supervisor that never comes; the socket answers at once

    mark = world.mark()
    assert world["carol"].call("serve_stop", id=server["id"])["state"] == "stopping"
    own = world["alice"].call("serve_start", booking=booking["id"], model=MODEL)["server"]
    assert world["alice"].call("serve_stop", id=own["id"])["state"] == "stopping"
    stops = [e[:5] for e in world.events_since(mark) if e[2] == "server-stop"]
    assert stops == [("carol", uid("carol"), "server-stop", booking["id"], True),
                     ("alice", uid("alice"), "server-stop", booking["id"], True)]


@socket_only
def test_only_the_holder_registers_as_a_servers_supervisor_and_an_admin_stops_it(world):
    booking = world.book("alice", 7, now())
    server = world["alice"].call("serve_start", booking=booking["id"], model=MODEL)["server"]
    mark = world.mark()
    for user in ("bob", "carol"):
        refused = Stream(user, world.agent.socket, "register", {"kind": "server", "server": server["id"]})
        with pytest.raises(NotPermitted, match=f"^server {server['id']} belongs to alice$"):
            refused.first()
        refused.close()
    assert world.refusals_since(mark) == [("bob", uid("bob"), "server-register", booking["id"]),
                                          ("carol", uid("carol"), "server-register", booking["id"])]

    log = f"/nonexistent/alice/{server['id']}.log"  # what her supervisor says; the service never opens it
    supervisor = Stream("alice", world.agent.socket, "register", {"kind": "server", "server": server["id"], "log": log})
    try:
        assert supervisor.first()["server"] == server["id"]
        # The log's path is for its holder; an admin reads the lines the supervisor sent, not where it keeps them.
        assert world["alice"].call("serve_logs", id=server["id"])["log"] == log
        assert world["carol"].call("serve_logs", id=server["id"])["log"] is None

        assert world["carol"].call("serve_stop", id=server["id"])["state"] == "stopping"
        assert supervisor.close() == -15  # SIGTERM, through the service's pidfd
        deadline = time.monotonic() + 15  # the service records the end once it sees the pidfd exit
        while world["carol"].call("serve_get", id=server["id"])["state"] == "stopping" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert world["carol"].call("serve_get", id=server["id"])["state"] == "stopped"
    finally:
        supervisor.close()


@socket_only
def test_only_the_holder_sees_where_her_servers_log_is_and_only_she_and_admins_read_it(world):
    """A server's log may hold the prompts the gateway relayed to it (a --verbose server logs them): bob, a member,
    reads neither its lines nor its crash tail (exit 4, audited); carol, an admin, reads the lines but not the path."""
    booking = world.book("alice", 3, now())
    server = world["alice"].call("serve_start", booking=booking["id"], model=MODEL)["server"]
    log = f"/nonexistent/alice/{server['id']}.log"
    supervisor = Stream("alice", world.agent.socket, "register", {"kind": "server", "server": server["id"], "log": log})
    try:
        supervisor.first()
        assert world["alice"].call("serve_get", id=server["id"])["log_path"] == log
        assert world["alice"].call("serve_logs", id=server["id"])["log"] == log
        assert world["carol"].call("serve_logs", id=server["id"]) == {"lines": [], "state": "starting", "live": True,
                                                                      "log": None}
        mark = world.mark()
        with pytest.raises(NotPermitted, match=f"^server {server['id']} belongs to alice; only they or an admin can"
                                               " read its log$"):
            world["bob"].call("serve_logs", id=server["id"])
        assert world.refusals_since(mark) == [("bob", uid("bob"), "server-logs", booking["id"])]
        for user in ("bob", "carol"):
            assert [s["log_path"] for s in world[user].call("serve_list") if s["id"] == server["id"]] == [""]
            assert world[user].call("serve_get", id=server["id"])["log_path"] == ""
    finally:
        supervisor.close()
    # Settle it here (its supervisor is gone: crashed), not in a later test that counts the audit log.
    deadline = time.monotonic() + 10
    while world["alice"].call("serve_get", id=server["id"])["state"] not in ("crashed", "stopped"):
        assert time.monotonic() < deadline
        time.sleep(0.05)


# -- the power policy: any member reads it, admins change a card -------------------------------------------


def test_a_member_reads_the_power_policy_and_only_an_admin_changes_a_cards_limit(world):
    """alice (a member) sees each card's limit but may not set one; carol (an admin) may, audited; the card then
    reads what carol set, not what alice asked.
    Wrong versions: the admin check dropped (or asked of the caller's membership); the member's attempt applied and
    only the reply refused."""
    assert world["alice"].call("power")["cards"][4]["limit_w"] == 575.0
    mark = world.mark()
    with pytest.raises(NotPermitted, match="changing a card's power is for admins"):
        world["alice"].call("power_step", card=4, limit_w=450)
    with pytest.raises(NotPermitted, match="changing a card's power is for admins"):
        world["bob"].call("power_step", card=4, persistence=False)
    assert [(c["limit_w"], c["persistence"]) for c in world["alice"].call("power")["cards"]][4] == (575.0, True)
    try:
        assert world["carol"].call("power_step", card=4, limit_w=500) == {"card": 4, "from_w": 575.0, "to_w": 500}
        assert [(c["limit_w"], c["persistence"]) for c in world["alice"].call("power")["cards"]][4] == (500.0, True)
        assert [e[:3] + (e[4],) for e in world.events_since(mark) if e[4]] == [
            ("carol", uid("carol"), "power-limit", True)]
    finally:
        world.root.call("power_step", card=4, limit_w=575)  # the module's fleet as it was


# -- the door, and admin: the peer process's own groups -------------------------------------------------


@socket_only
def test_a_non_member_is_refused_at_the_door_and_the_groups_are_the_processes_own(world):
    socket = world.agent.socket
    before, mark = world.written(), world.mark()
    with pytest.raises(NotPermitted, match=f"no access to the board service at {socket}.* group {MEMBERS_GROUP}$"):
        call_once("mallory", socket, "whoami")  # the socket's mode, before the service sees him
    os.chmod(socket, 0o666)  # a mistake: the service's own check still holds
    try:
        door = f"^no access to the board: ask an admin to add you to group {MEMBERS_GROUP}$"
        for op, args in (("whoami", {}), ("list", {}), ("book", {"count": 1, "start": tomorrow(), "end": tomorrow(1)})):
            with pytest.raises(NotPermitted, match=door):
                call_once("mallory", socket, op, **args)
        for op, args in (("register", {"kind": "job"}), ("subscribe", {"kinds": ["notice"]})):
            stream = Stream("mallory", socket, op, args)
            with pytest.raises(NotPermitted, match=door):
                stream.first()
            stream.close()
        # carol's account is in both groups; a process of hers that dropped them is not let in ...
        with pytest.raises(NotPermitted, match=door):
            call_once("carol", socket, "whoami", groups=[])
        # ... one in the admin group alone is, as an admin, and the service's own user by its uid alone.
        assert pick(call_once("carol", socket, "whoami", groups=[ADMIN_GROUP])) == ("carol", True)
        assert pick(call_once(SERVICE_USER, socket, "whoami", groups=[])) == (SERVICE_USER, False)
    finally:
        os.chmod(socket, 0o660)
    assert pick(world.root.call("whoami")) == ("root", True)
    assert world.written() == before and world.events_since(mark) == []  # refused at the door: nothing written


@socket_only
def test_a_client_refused_at_the_door_is_refused_again_on_its_next_write(world):
    os.chmod(world.agent.socket, 0o666)
    mallory = Remote("mallory", world.agent.socket)
    try:
        with pytest.raises(NotPermitted, match="no access to the board"):
            mallory.call("whoami")
        with pytest.raises(NotPermitted, match="no access to the board"):  # sent again: the door never read it
            mallory.call("book", count=1, start=tomorrow(), end=tomorrow(1))
    finally:
        os.chmod(world.agent.socket, 0o660)
        mallory.close()


@socket_only
def test_a_process_without_the_admin_group_is_no_admin(world):
    booking = world.book("alice", 1, tomorrow())
    mark = world.mark()
    member = Remote("carol", world.agent.socket, groups=[MEMBERS_GROUP])
    try:
        assert pick(member.call("whoami")) == ("carol", False)
        with pytest.raises(NotPermitted, match="only admins"):
            member.call("reassign", id=booking["id"], cards=[2])
        with pytest.raises(NotPermitted, match="belongs to alice"):
            member.call("cancel", id=booking["id"])
    finally:
        member.close()
    assert world.refusals_since(mark) == [("carol", uid("carol"), "reassign", booking["id"]),
                                          ("carol", uid("carol"), "cancel", booking["id"])]
    assert pick(world["carol"].call("whoami")) == ("carol", True)  # with her account's groups she is


def call_once(user: str, socket: Path, op: str, groups: list[str] | None = None, **args: Any) -> Any:
    """One call from a process of its own, as each CLI command is."""
    caller = Remote(user, socket, groups=groups)
    try:
        return caller.call(op, **args)
    finally:
        caller.close()


def pick(me: dict) -> tuple[str, bool]:
    return me["user"], me["admin"]


# -- notices: to the holders alone ------------------------------------------------------------------------


@socket_only
def test_a_reassigns_notice_reaches_only_the_holders_before_and_after(world):
    alices = world.book("alice", 4, tomorrow())
    bobs = world.book("bob", 5, tomorrow())
    streams = {user: Stream(user, world.agent.socket, "subscribe", {"kinds": ["notice"]}) for user in ("alice", "bob")}
    try:
        for stream in streams.values():
            stream.first()  # subscribed: whatever is published from now on reaches it
        world["carol"].call("reassign", id=alices["id"], cards=[6])
        world["carol"].call("reassign", id=bobs["id"], cards=[7])
        # bob's first notice is about his own booking: alice's move, published before it, never reached him.
        assert streams["alice"].next_event("notice")["message"] == (
            f"booking {alices['id']} was moved to card 6 by admin carol")
        assert streams["bob"].next_event("notice")["message"] == f"booking {bobs['id']} was moved to card 7 by admin carol"
        world["carol"].call("reassign", id=alices["id"], user="bob")  # both holders hear of this one
        for stream in streams.values():
            assert stream.next_event("notice")["message"] == f"booking {alices['id']} was given to bob by admin carol"
        assert world["alice"].call("get", id=alices["id"])["notice"] == "given to bob by admin carol"
    finally:
        for stream in streams.values():
            stream.close()
