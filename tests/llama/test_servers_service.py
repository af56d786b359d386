"""llama-servers through the board service, as the shared install runs them: the real agent as user board
(setpriv, CAP_KILL only), real members (alice, bob, carol) running the real CLI, a real llama-server.

The member's own `board serve start` launches the supervisor as the member; the supervisor registers
with the service, which signals only through the pidfd it opened. Needs root (real users) and the
llama-server binary; skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import time
from datetime import datetime
from pathlib import Path

import pytest

from app.llama.health import health
from tests.llama.conftest import gone
from tests.ports import port_range
from tests.service.support import SERVICE_USER, Agent, check_reachable, needs_root, run_as
from tests.unix_users import ensure_unix_users
from tests.shared_install import scratch_dir

# A supervisor that registers a server the service leased and reports it ready with memory figures that are
# junk (as a member's own process could send), then its exit; prints the row as it was once ready.
JUNK_MEMORY = """
import json, socket, sys, time
from app.client.socket import SocketClient
path, booking, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
client = SocketClient(path)
server = client.call("serve_start", booking=booking, model=model)["server"]
sock = socket.socket(socket.AF_UNIX)
sock.connect(path)
reader = sock.makefile("rb")
def send(message):
    sock.sendall((json.dumps(message) + "\\n").encode())
send({"v": 1, "id": 1, "op": "register", "args": {"kind": "server", "server": server["id"], "log": "/nonexistent"}})
assert json.loads(reader.readline())["ok"]
send({"event": "ready", "memory": {"source": "lines", "devices": {"CPU": "junk"}}})
deadline = time.monotonic() + 15
while (row := client.call("serve_get", id=server["id"]))["state"] == "starting" and time.monotonic() < deadline:
    time.sleep(0.05)
send({"event": "exit", "code": 0, "signal": None, "text": "exit code 0", "tail": [], "asked": True})
sock.close()
print(json.dumps(row))
"""

pytestmark = [pytest.mark.real_users, pytest.mark.usefixtures("_subreaper")]

MEMBERS, ADMINS = "boardusers", "boardadmins"
BOARD = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "board"


class SharedBoard:
    """One agent (user board) with [llama] configured, and the members' CLI."""

    def __init__(self, root: Path, llama_server: str, tiny_model: Path) -> None:
        self.root = root
        self.agent = Agent(root)
        self.agent.write_config()
        bin_dir, models = root / "bin", root / "models"
        bin_dir.mkdir()
        models.mkdir()
        self.server_bin = bin_dir / "llama-server"
        shutil.copy2(llama_server, self.server_bin)
        self.model = models / "tiny.gguf"
        shutil.copy2(tiny_model, self.model)
        for path, mode in ((bin_dir, 0o755), (self.server_bin, 0o755), (models, 0o755), (self.model, 0o644)):
            os.chmod(path, mode)
        self.port_min, port_max = port_range("llama_service", 20)
        self.agent.config.write_text(
            f'[storage]\ndb = "{self.agent.db}"\n\n'
            f'[service]\nsocket = "{self.agent.socket}"\ngroup = "{MEMBERS}"\n\n'
            f'[access]\nadmin_group = "{ADMINS}"\n\n'
            f'[enforce]\ninterval_s = 0.5\ngrace_s = 2\n\n'
            f'[llama]\nserver_bin = "{self.server_bin}"\nmodel_dirs = ["{models}"]\n'
            f'port_min = {self.port_min}\nport_max = {port_max}\nready_timeout_s = 60\n')
        self.homes: dict[str, Path] = {}
        for name in ("alice", "bob", "carol"):
            home = root / f"home-{name}"
            home.mkdir()
            entry = pwd.getpwnam(name)
            os.chown(home, entry.pw_uid, entry.pw_gid)
            os.chmod(home, 0o700)  # the service (user board) cannot read a member's logs
            self.homes[name] = home

    def run(self, user: str, *args: str, timeout: float = 120, env: dict | None = None):
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TZ": "UTC", "HOME": str(self.homes[user]),
               "BOARD_CONFIG": str(self.agent.config), "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
        return run_as(user, str(BOARD), *args, env=env, timeout=timeout)

    def ok(self, user: str, *args: str):
        result = self.run(user, *args)
        assert result.returncode == 0, f"{user}: board {' '.join(args)} -> {result.returncode}\n{result.stderr}"
        return result

    def json(self, user: str, *args: str):
        return json.loads(self.ok(user, *args, "--json").stdout)

    def server(self, server_id: int, user: str = "carol") -> dict:
        return next(s for s in self.json(user, "serve", "list", "--all")["servers"] if s["id"] == server_id)

    def wait_state(self, server_id: int, states: tuple[str, ...], timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            server = self.server(server_id)
            if server["state"] in states or time.monotonic() > deadline:
                return server
            time.sleep(0.2)

    def events(self, action: str) -> list[dict]:
        return [e for e in self.json("carol", "log", "--limit", "200")["events"] if e["action"] == action]


@pytest.fixture
def shared(llama_server, tiny_model):
    needs_root()
    ensure_unix_users()  # alice, bob, carol and the service user, whichever suite runs first
    for name in (SERVICE_USER, "alice"):
        check_reachable(name)
    root = scratch_dir("board-llama-service-")
    board = SharedBoard(root, llama_server, tiny_model)
    board.agent.start()
    yield board
    try:
        for server in board.json("carol", "serve", "list")["servers"]:  # a failed test's leftovers
            if server["pgid"]:
                try:
                    os.killpg(server["pgid"], 9)
                except (ProcessLookupError, PermissionError):
                    pass
    finally:
        rc = board.agent.stop()
        shutil.rmtree(root, ignore_errors=True)
    assert rc == 0, board.agent.log_text()


class TestThroughTheService:
    def test_alice_starts_bob_cannot_stop_alice_stops_and_the_group_is_gone(self, shared):
        booking = shared.json("alice", "book", "--cards", "2", "--for", "1h")["id"]
        server = shared.json("alice", "serve", "start", str(booking), "--model", str(shared.model), "--ctx", "256")
        assert server["state"] == "ready" and server["user"] == "alice"
        assert health(server["host"], server["port"]) == 200
        alice = pwd.getpwnam("alice").pw_uid
        # The kernel's view: the supervisor and llama-server are alice's, in the supervisor's group.
        assert os.stat(f"/proc/{server['supervisor_pid']}").st_uid == alice
        assert os.stat(f"/proc/{server['pid']}").st_uid == alice
        assert os.getpgid(server["pid"]) == server["pgid"] == server["supervisor_pid"]
        # The log is alice's own, in her home, which user board cannot read.
        assert server["log"].startswith(str(shared.homes["alice"]))

        # bob: exit 4, one line, audited; the server keeps serving.
        refused = shared.run("bob", "serve", "stop", str(server["id"]))
        assert refused.returncode == 4, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and "alice" in refused.stderr
        bob = pwd.getpwnam("bob").pw_uid
        assert [e["ok"] for e in shared.events("server-stop") if e["uid"] == bob] == [False]
        assert health(server["host"], server["port"]) == 200
        # Her log is hers and admins' (a --verbose server logs the prompts it is sent): bob is refused; carol, an
        # admin, reads the lines the supervisor sent to the service (never from alice's file).
        # (-n 500: at -lv 4 llama.cpp logs some 160 lines at load, so board's header is not among the last 50)
        refused = shared.run("bob", "serve", "logs", str(server["id"]), "-n", "500")
        assert refused.returncode == 4 and refused.stdout == "" and "only they or an admin" in refused.stderr
        logs = shared.ok("carol", "serve", "logs", str(server["id"]), "-n", "500").stdout
        assert f"server {server['id']} for booking {booking} (alice)" in logs

        stopped = shared.json("alice", "serve", "stop", str(server["id"]))
        assert stopped["state"] == "stopped" and stopped["exit_code"] == 0, stopped
        assert gone(server), "a process of the server's group is still there"
        assert health(server["host"], server["port"], timeout=0.5) is None
        assert [e["ok"] for e in shared.events("server-stop") if e["uid"] == alice] == [True]

    def test_the_service_never_opens_the_model_a_member_names(self, shared):
        # alice's own copy, in her 0700 home: user board cannot even see it, and need not.
        mine = shared.homes["alice"] / "private.gguf"
        shutil.copy2(shared.model, mine)
        alice = pwd.getpwnam("alice")
        os.chown(mine, alice.pw_uid, alice.pw_gid)
        os.chmod(mine, 0o600)
        booking = shared.json("alice", "book", "--cards", "5", "--for", "1h")["id"]
        server = shared.json("alice", "serve", "start", str(booking), "--model", str(mine), "--ctx", "256")
        assert server["state"] == "ready" and server["model"] == str(mine)
        assert health(server["host"], server["port"]) == 200
        # bob names the same file: his own process cannot read it, so nothing reaches the service.
        booking_bob = shared.json("bob", "book", "--cards", "6", "--for", "1h")["id"]
        refused = shared.run("bob", "serve", "start", str(booking_bob), "--model", str(mine))
        assert refused.returncode == 2 and "can't read the model" in refused.stderr, refused.stderr
        assert [e for e in shared.events("server-start") if e["uid"] == pwd.getpwnam("bob").pw_uid] == []
        shared.json("alice", "serve", "stop", str(server["id"]))

    def test_at_booking_end_the_service_stops_it(self, shared):
        booking = shared.json("alice", "book", "--cards", "4", "--for", "1h")["id"]
        server = shared.json("alice", "serve", "start", str(booking), "--model", str(shared.model), "--ctx", "256")
        assert server["state"] == "ready"
        shared.ok("alice", "release", str(booking))  # the booking ends now
        after = shared.wait_state(server["id"], ("stopped", "crashed"))
        assert after["state"] == "stopped" and after["reason"] == f"booking {booking} ended", after
        assert gone(server)
        [event] = [e for e in shared.events("server-stop") if e["actor"] == "board-agent"]
        assert event["details"]["reason"] == f"booking {booking} ended"

    def test_a_crash_is_recorded_with_its_exit_and_log_tail(self, shared):
        booking = shared.json("alice", "book", "--cards", "5", "--for", "1h")["id"]
        server = shared.json("alice", "serve", "start", str(booking), "--model", str(shared.model), "--ctx", "256")
        os.kill(server["pid"], 9)
        crashed = shared.wait_state(server["id"], ("crashed",))
        assert crashed["state"] == "crashed" and crashed["exit_signal"] == 9, crashed
        assert any("listening" in line or "model loaded" in line for line in crashed["log_tail"])
        assert gone(server)


class TestMemory:
    def test_llama_cpps_figures_reach_the_service_with_ready_and_everyone_sees_them(self, shared):
        from app.llama.memory import Measured, read_memory

        booking = shared.json("alice", "book", "--cards", "3", "--for", "1h")["id"]
        server = shared.json("alice", "serve", "start", str(booking), "--model", str(shared.model), "--ctx", "256")
        assert server["state"] == "ready" and server["measured"] is not None
        with open(server["log"]) as log:  # alice's own file; the service never opened it
            assert server["measured"] == read_memory(log).to_json()
        measured = Measured.from_json(server["measured"])
        assert measured.weights_mib > 0 and measured.kv_cells == 256
        [planned] = server["estimate"]["per_card_mib"]
        assert server["estimate"]["fits"] is True and planned > measured.total_mib
        # carol, another member, sees both figures: in the JSON and as MEM in the table.
        assert shared.server(server["id"], "carol")["measured"] == server["measured"]
        table = shared.ok("carol", "serve", "list").stdout.splitlines()
        assert table[0].split()[8] == "MEM" and table[1].split()[8] == f"{measured.total_mib:.0f}/{planned}M", table
        shared.json("alice", "serve", "stop", str(server["id"]))
        assert gone(server)

    def test_a_junk_memory_report_is_logged_and_ignored_and_the_server_is_still_ready(self, shared):
        booking = shared.json("alice", "book", "--cards", "6", "--for", "1h")["id"]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(shared.homes["alice"]),
               "PYTHONDONTWRITEBYTECODE": "1"}
        # In a session of its own, as a real supervisor: the row records its group, which the fixture's
        # cleanup SIGKILLs, and that must not be pytest's.
        result = run_as("alice", "setsid", "-w", str(BOARD.parent / "python"), "-c", JUNK_MEMORY,
                        str(shared.agent.socket), str(booking), str(shared.model), env=env)
        assert result.returncode == 0, result.stderr
        row = json.loads(result.stdout)
        assert row["state"] == "ready" and row["measured"] is None
        assert "ignored a memory report that is not llama.cpp's figures" in shared.agent.log_text()
        after = shared.wait_state(row["id"], ("stopped",))
        assert after["state"] == "stopped", after  # the service went on serving the connection to its end


def _request(server: dict, path: str, body: dict | None = None, key: str | None = None):
    """An HTTP response from the server itself (the caller reads it), with `key` as its bearer token."""
    import http.client

    conn = http.client.HTTPConnection(server["host"], server["port"], timeout=60)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    conn.request("POST" if body is not None else "GET", path, json.dumps(body) if body is not None else None, headers)
    return conn.getresponse()


class TestKeysAndRestarts:
    def test_each_server_has_a_key_only_its_holder_and_admins_read(self, shared):
        booking = shared.json("alice", "book", "--cards", "1", "--for", "1h")["id"]
        server = shared.json("alice", "serve", "start", str(booking), "--model", str(shared.model), "--ctx", "256")
        key = shared.json("alice", "serve", "key", str(server["id"]))["key"]
        assert shared.json("carol", "serve", "key", str(server["id"]))["key"] == key  # an admin
        refused = shared.run("bob", "serve", "key", str(server["id"]))
        assert refused.returncode == 4 and "alice" in refused.stderr and key not in refused.stdout + refused.stderr
        assert [e["ok"] for e in shared.events("server-key")] == [False]
        for user in ("alice", "bob", "carol"):  # in no listing
            assert key not in shared.ok(user, "serve", "list", "--all", "--json").stdout
        # Nobody without the key uses the port (bob has a shell on the host); /health stays open for monitors.
        assert _request(server, "/v1/models", key=None).status == 401
        assert _request(server, "/slots", key=None).status == 401  # not even which slots are busy
        assert _request(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2}, key="guess").status == 401
        assert _request(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2}, key=key).status == 200
        assert health(server["host"], server["port"]) == 200
        shared.json("alice", "serve", "stop", str(server["id"]))
        assert gone(server)

    def test_the_service_killed_mid_stream_stops_no_server(self, shared):
        booking = shared.json("alice", "book", "--cards", "0", "--for", "1h")["id"]
        server = shared.json("alice", "serve", "start", str(booking), "--model", str(shared.model), "--ctx", "512")
        key = shared.json("alice", "serve", "key", str(server["id"]))["key"]
        stream = _request(server, "/v1/completions", {"prompt": "once upon a time", "max_tokens": 300, "stream": True,
                                                      "ignore_eos": True}, key=key)
        assert stream.status == 200
        first = stream.readline()
        assert first.startswith(b"data: ")

        shared.agent.kill9()  # an upgrade gone wrong: no goodbye to anyone
        assert health(server["host"], server["port"]) == 200
        shared.agent.start()
        # Its supervisor registers again on its own; the service checked pid, start time and uid.
        deadline = time.monotonic() + 30
        while f"server {server['id']} (alice, port {server['port']}): its supervisor registered again" \
                not in shared.agent.log_text():
            assert time.monotonic() < deadline, shared.agent.log_text()
            time.sleep(0.1)
        chunks = [first]
        while line := stream.readline():
            if line.strip():
                chunks.append(line)
        assert chunks[-1].strip() == b"data: [DONE]", chunks[-3:]
        last = json.loads(chunks[-2][len(b"data: "):])
        assert last["usage"]["completion_tokens"] == 300, last  # the whole answer, streamed across the restart
        after = shared.server(server["id"], "alice")
        assert after["state"] == "ready" and after["pid"] == server["pid"], after
        assert os.getpgid(server["pid"]) == server["pgid"]  # the very same process
        # Supervised again: a stop reaches it through the service, and its end is recorded as it happened.
        stopped = shared.json("alice", "serve", "stop", str(server["id"]))
        assert stopped["state"] == "stopped" and stopped["exit_code"] == 0, stopped
        assert gone(server)

    def test_while_the_service_is_away_the_supervisor_stops_its_server_at_the_bookings_end(self, shared):
        booking = shared.json("alice", "book", "--cards", "3", "--start", "now", "--for", "1m")
        started = shared.run("alice", "serve", "start", str(booking["id"]), "--model", str(shared.model), "--ctx",
                             "256", "--json", env={"BOARD_LLAMA_BACKSTOP_S": "0"})
        assert started.returncode == 0, started.stderr
        server = json.loads(started.stdout)
        assert shared.agent.stop() == 0  # down for good (systemctl stop): nobody but the supervisor is left
        assert health(server["host"], server["port"]) == 200  # the service's stop stopped no server
        assert gone(server, timeout=120), "the server outlived its booking with the service away"
        end = datetime.fromisoformat(booking["end"]).timestamp()
        assert time.time() >= end
        with open(server["log"]) as log:  # alice's own log says why
            assert "the booking is over and the board service is away; stopping the server" in log.read()
        shared.agent.start()  # back: it takes back nothing, and records the server as ended
        assert shared.wait_state(server["id"], ("stopped", "crashed"))["state"] in ("stopped", "crashed")

    def test_a_supervisor_that_is_not_the_recorded_one_cannot_resume(self, shared):
        booking = shared.json("alice", "book", "--cards", "2", "--for", "1h")["id"]
        server = shared.json("alice", "serve", "start", str(booking), "--model", str(shared.model), "--ctx", "256")
        resume = ("import json, socket, sys\n"
                  "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
                  "s.sendall((json.dumps({'v': 1, 'id': 1, 'op': 'register', 'args': {'kind': 'server',"
                  " 'server': int(sys.argv[2]), 'resume': True}}) + '\\n').encode())\n"
                  "print(s.makefile().readline())\n")
        for user in ("alice", "bob"):  # alice's other process, or another member
            result = run_as(user, str(BOARD.parent / "python"), "-c", resume, str(shared.agent.socket),
                            str(server["id"]))
            answer = json.loads(result.stdout)
            assert answer["ok"] is False and "not the supervisor it recorded" in answer["error"]["message"], answer
        assert shared.server(server["id"])["state"] == "ready"
        shared.json("alice", "serve", "stop", str(server["id"]))
        assert gone(server)


@pytest.fixture
def runner(shared):
    """`board runner` as board-runner.service starts it: setpriv --reuid board-llama, no capabilities."""
    process = start_runner(shared)
    yield process
    process.terminate()
    process.wait(15)


def start_runner(shared: SharedBoard):
    """`board runner` for `shared`'s agent, once it has registered (the process; its `log` is the file it writes):
    as board-runner.service starts it, setpriv --reuid board-llama, no capabilities. Terminate it after."""
    import subprocess

    from tests.agent_process import ENVIRON, SETPRIV
    from tests.unix_users import RUNNER_USER, ensure_system_user

    entry = ensure_system_user(RUNNER_USER, MEMBERS)
    check_reachable(RUNNER_USER)
    state = shared.root / "runner-state"  # the unit's StateDirectory=
    state.mkdir()
    os.chown(state, entry.pw_uid, entry.pw_gid)
    os.chmod(state, 0o700)
    log = shared.root / "runner.log"
    with open(log, "ab") as out:
        process = subprocess.Popen(
            ["/bin/sh", "-c", 'umask 077; exec "$@"', "sh", SETPRIV, "--reuid", RUNNER_USER, "--regid", RUNNER_USER,
             "--init-groups", "--", str(BOARD), "runner"],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**ENVIRON, "BOARD_CONFIG": str(shared.agent.config), "XDG_STATE_HOME": str(state)})
    process.log = log
    deadline = time.monotonic() + 30
    while "board runner: registered with the service" not in log.read_text():
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    return process


class TestPlannedServers:
    def test_a_planned_server_starts_at_its_booking_start_and_stops_at_its_end_with_nobody_logged_in(
            self, shared, runner):
        import sqlite3
        from datetime import datetime, timedelta, timezone

        from app.store.plans import planned_servers

        start = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(seconds=10)
        booking = shared.json("alice", "book", "--cards", "7", "--start", start.isoformat(), "--for", "1m")
        plan = shared.json("alice", "serve", "plan", str(booking["id"]), "--model", str(shared.model), "--ctx", "256",
                           "--alias", "team")
        assert plan["alias"] == "team" and plan["next_booking"] == booking["id"]
        assert plan["next_start"] == int(start.timestamp())
        listed = shared.ok("bob", "serve", "plan", "--list").stdout  # the team sees what will be served, and when
        assert "team" in listed and f"booking {booking['id']}" in listed
        with sqlite3.connect(shared.agent.db) as conn:  # what the gateway shows as planned (CONTRACT20)
            assert planned_servers(conn, int(time.time())) == [
                {"alias": "team", "booking": booking["id"], "start": int(start.timestamp()),
                 "end": int(start.timestamp()) + 60, "user": "alice"}]
        # alice's commands have all exited: from here on no process of hers takes part.
        deadline = time.monotonic() + 40
        while not (found := [s for s in shared.json("alice", "serve", "list", "--all")["servers"]
                             if s["booking_id"] == booking["id"]]) or found[0]["state"] != "ready":
            assert time.monotonic() < deadline, (found, runner.log.read_text()[-2000:], shared.agent.log_text())
            time.sleep(0.2)
        [server] = found
        assert server["user"] == "alice" and server["alias"] == "team"
        assert datetime.fromisoformat(server["started"]) >= start  # not before its booking
        llama = pwd.getpwnam("board-llama").pw_uid
        for pid in (server["pid"], server["supervisor_pid"]):  # run by the runner's user, not alice's
            assert os.stat(f"/proc/{pid}").st_uid == llama
        key = shared.json("alice", "serve", "key", str(server["id"]))["key"]  # the holder's, as any server's
        assert _request(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2}, key=key).status == 200
        header = f"server {server['id']} for booking {booking['id']} (alice)"  # board's first line of the log
        for user in ("alice", "carol"):  # its holder and an admin read the log the runner's supervisor keeps
            logs = shared.run(user, "serve", "logs", str(server["id"]), "-n", "500")
            assert logs.returncode == 0 and header in logs.stdout, (user, logs.stdout[-500:], logs.stderr)
        with sqlite3.connect(shared.agent.db) as conn:  # up: no longer planned
            assert planned_servers(conn, int(time.time())) == []

        # The service restarts: the server keeps serving, its supervisor (board-llama's) and the runner register again.
        shared.agent.kill9()
        shared.agent.start()
        deadline = time.monotonic() + 30
        while f"server {server['id']} (alice, port {server['port']}): its supervisor registered again" \
                not in shared.agent.log_text() or runner.log.read_text().count("registered with the service") < 2:
            assert time.monotonic() < deadline, (shared.agent.log_text(), runner.log.read_text())
            time.sleep(0.1)
        assert _request(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2}, key=key).status == 200
        # The restarted service kept none of the log: the supervisor sends its end again (before, nothing, exit 0).
        while header not in (logs := shared.run("alice", "serve", "logs", str(server["id"]), "-n", "500")).stdout:
            assert time.monotonic() < deadline + 15, (logs.stdout[-500:], logs.stderr)
            time.sleep(0.2)

        after = shared.wait_state(server["id"], ("stopped", "crashed"), timeout=90)
        assert after["state"] == "stopped" and after["reason"] == f"booking {booking['id']} ended", after
        assert datetime.fromisoformat(after["ended"]) >= start + timedelta(minutes=1)
        assert gone(server)
        assert f"started server {server['id']}" in runner.log.read_text()

    def test_a_runner_that_cannot_write_its_state_directory_refuses_to_start(self, shared):
        import subprocess

        from tests.agent_process import ENVIRON, SETPRIV
        from tests.unix_users import RUNNER_USER, ensure_system_user

        ensure_system_user(RUNNER_USER, MEMBERS)
        state = shared.root / "root-state"  # root's, 0755: board-llama cannot write there
        state.mkdir(mode=0o755)
        result = subprocess.run(
            [SETPRIV, "--reuid", RUNNER_USER, "--regid", RUNNER_USER, "--init-groups", "--", str(BOARD), "runner"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
            env={**ENVIRON, "BOARD_CONFIG": str(shared.agent.config), "XDG_STATE_HOME": str(state)})
        assert result.returncode == 1, (result.stdout, result.stderr)
        assert result.stderr.strip() == (f"board: the runner can't write its state directory {state}/board/servers"
                                         " (Permission denied): the servers' logs go there; give the runner's user a"
                                         " writable StateDirectory= (XDG_STATE_HOME)"), result.stderr
        assert "board agent: runner registered" not in shared.agent.log_text()  # it never registered

    def test_a_start_the_runner_cannot_make_says_why_on_the_servers_row(self, shared, runner):
        servers = shared.root / "runner-state" / "board" / "servers"
        llama = pwd.getpwnam("board-llama")
        for directory in (servers.parent, servers):
            directory.mkdir(exist_ok=True)
            os.chown(directory, llama.pw_uid, llama.pw_gid)
        os.chmod(servers, 0o500)  # the log can no longer be created: the supervisor never runs
        booking = shared.json("alice", "book", "--cards", "6", "--for", "1h")["id"]
        shared.json("alice", "serve", "plan", str(booking), "--model", str(shared.model), "--ctx", "256")
        deadline = time.monotonic() + 30
        while not (found := [s for s in shared.json("alice", "serve", "list", "--all")["servers"]
                             if s["booking_id"] == booking and s["state"] != "starting"]):
            assert time.monotonic() < deadline + 30, (runner.log.read_text()[-2000:], shared.agent.log_text())
            time.sleep(0.2)
        [server] = found
        assert server["state"] == "failed", server
        assert server["reason"] == (f"the runner: can't write the server log in {servers}: Permission denied"), server
        listed = shared.ok("alice", "serve", "list", "--all").stdout
        assert "the runner: can't write the server log" in listed
        logs = shared.run("alice", "serve", "logs", str(server["id"]))  # no log at all: said, not a silent nothing
        assert (logs.returncode, logs.stdout) == (0, "")
        assert logs.stderr == f"server {server['id']} is failed: the service holds no log lines for it (its supervisor" \
                              " sent none)\n"

    def test_only_the_runners_user_registers_as_the_runner(self, shared):
        refused = shared.run("alice", "runner")
        assert refused.returncode == 4 and "board-llama" in refused.stderr, refused.stderr
        started, said = refused.stderr.strip().splitlines()  # its log's first line (stderr), then one line why
        assert " INFO board runner: uid " in started and said.startswith("board: the service refused the runner: ")

    def test_a_plan_needs_the_holder_and_a_model_the_runner_can_read(self, shared):
        booking = shared.json("alice", "book", "--cards", "6", "--for", "1h")["id"]
        refused = shared.run("bob", "serve", "plan", str(booking), "--model", str(shared.model))
        assert refused.returncode == 4 and "alice" in refused.stderr, refused.stderr
        mine = shared.homes["alice"] / "private.gguf"
        shutil.copy2(shared.model, mine)
        os.chown(mine, pwd.getpwnam("alice").pw_uid, -1)
        outside = shared.run("alice", "serve", "plan", str(booking), "--model", str(mine))
        assert outside.returncode == 2 and "model_dirs" in outside.stderr, outside.stderr
        plan = shared.json("alice", "serve", "plan", str(booking), "--model", str(shared.model))
        cancelled = shared.run("bob", "serve", "plan", "--cancel", str(plan["id"]))
        assert cancelled.returncode == 4
        assert shared.json("alice", "serve", "plan", "--cancel", str(plan["id"]))["cancelled"] is not None
        assert shared.json("alice", "serve", "plan", "--list")["plans"] == []


def _files_under(root: Path) -> list[Path]:
    return [Path(d) / f for d, _, files in os.walk(root) for f in files]


def _plan_row(shared, booking: int, spec: dict) -> int:
    """A plan stored before the allow-list (as app.store.plans.insert writes one): bob's, for `booking`."""
    import sqlite3

    from app.store import plans as plan_rows

    bob = pwd.getpwnam("bob")
    with sqlite3.connect(shared.agent.db) as conn:
        return plan_rows.insert(conn, booking_id=booking, series_id=None, user="bob", uid=bob.pw_uid,
                                alias=spec["alias"], spec=spec, now=int(time.time()))


CALL = """
import json, sys
from app.client.socket import SocketClient
from app.errors import BoardError
try:
    print(json.dumps({"ok": SocketClient(sys.argv[1]).call(sys.argv[2], **json.loads(sys.argv[3]))}))
except BoardError as error:
    print(json.dumps({"code": error.exit_code, "message": str(error)}))
"""


def _call_as(user: str, shared, op: str, **args) -> dict:
    """One operation sent by `user`'s own process straight to the service's socket, as a member can."""
    result = run_as(user, str(BOARD.parent / "python"), "-c", CALL, str(shared.agent.socket), op, json.dumps(args))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


class TestTheKeyAttack:
    """The review's attack, replayed: bob's planned server reads alice's planned server's key (or log) as
    board-llama through a file flag (`--chat-template-file`), and shows it in GET /props."""

    def _wait_ready(self, shared, runner, booking: int) -> dict:
        deadline = time.monotonic() + 60
        while not (found := [s for s in shared.json("carol", "serve", "list", "--all")["servers"]
                             if s["booking_id"] == booking]) or found[0]["state"] != "ready":
            assert not found or found[0]["state"] == "starting", found
            assert time.monotonic() < deadline, (found, runner.log.read_text()[-2000:], shared.agent.log_text())
            time.sleep(0.2)
        return found[0]

    def test_bobs_planned_server_cannot_read_alices_key_or_log(self, shared, runner):
        state = shared.root / "runner-state"
        alices = shared.json("alice", "book", "--cards", "5", "--for", "1h")["id"]
        shared.json("alice", "serve", "plan", str(alices), "--model", str(shared.model), "--ctx", "256")
        alice = self._wait_ready(shared, runner, alices)
        key = shared.json("alice", "serve", "key", str(alice["id"]))["key"]
        assert _request(alice, "/v1/completions", {"prompt": "hi", "max_tokens": 2}, key=key).status == 200
        assert _request(alice, "/v1/completions", {"prompt": "hi", "max_tokens": 2}).status == 401
        # Her key lies in no file the runner's user could read: it went to llama-server through a pipe.
        files = _files_under(state)
        assert [f.name for f in files] == [f"{alice['id']}.log"], files
        assert not any(key.encode() in f.read_bytes() for f in files)
        key_path, log_path = state / "board" / "servers" / f"{alice['id']}.key", files[0]

        bobs = shared.json("bob", "book", "--cards", "4", "--for", "1h")["id"]
        for extra in (["--chat-template-file", str(key_path)], ["--chat-template-file", str(log_path)],
                      ["--chat_template_file", str(log_path)], ["--log-file", str(log_path)],
                      ["--slot-save-path", str(state)], ["--media-path", str(state)], ["--lora", str(key_path)],
                      ["--mmproj-url", "http://127.0.0.1:1/x"]):
            refused = shared.run("bob", "serve", "start", str(bobs), "--model", str(shared.model), "--", *extra)
            assert refused.returncode == 2, (extra, refused.stderr)
            assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
            assert f"extra argument {extra[0].replace('_', '-')} " in refused.stderr, refused.stderr
            # `serve plan` takes no extra arguments on its command line; the service's op does, as bob sends it
            answer = _call_as("bob", shared, "serve_plan", booking=bobs, model=str(shared.model), extra=extra)
            assert answer["code"] == 2 and f"extra argument {extra[0].replace('_', '-')} " in answer["message"], answer
        assert [p["user"] for p in shared.json("bob", "serve", "plan", "--list")["plans"]] == ["alice"]  # none of bob's

        # A plan stored before the allow-list with the attack's argument: refused at its start, the reason shown.
        plan = _plan_row(shared, bobs, {"model": str(shared.model), "ctx": 256, "alias": "bobs",
                                        "extra": ["--chat-template-file", str(key_path)]})
        deadline = time.monotonic() + 30
        while not (listed := next(p for p in shared.json("bob", "serve", "plan", "--list")["plans"]
                                  if p["id"] == plan))["refused"]:
            assert time.monotonic() < deadline, shared.agent.log_text()
            time.sleep(0.2)
        assert listed["refused"]["booking"] == bobs and "--chat-template-file" in listed["refused"]["error"]
        assert "model_dirs" in listed["refused"]["error"]
        text = shared.ok("bob", "serve", "plan", "--list").stdout
        assert f"plan {plan}: not started for booking {bobs}: extra argument --chat-template-file" in text
        assert not [s for s in shared.json("bob", "serve", "list", "--all")["servers"] if s["booking_id"] == bobs]

        # A name under model_dirs that bob may write (an upload directory), pointing at alice's log: the text
        # passes, the supervisor (board-llama) resolves it at the launch and refuses; the reason is on the row.
        uploads = shared.model.parent / "uploads"
        uploads.mkdir()
        os.chown(uploads, pwd.getpwnam("bob").pw_uid, -1)
        (uploads / "t.jinja").symlink_to(log_path)
        assert "id" in _call_as("bob", shared, "serve_plan", booking=bobs, model=str(shared.model), ctx=256,
                                alias="b2", extra=["--chat-template-file", str(uploads / "t.jinja")])["ok"]
        deadline = time.monotonic() + 30
        while not (found := [s for s in shared.json("bob", "serve", "list", "--all")["servers"]
                             if s["booking_id"] == bobs and s["state"] not in ("starting",)]):
            assert time.monotonic() < deadline, (runner.log.read_text()[-2000:], shared.agent.log_text())
            time.sleep(0.2)
        [crashed] = found
        assert crashed["state"] in ("crashed", "failed") and crashed["pid"] is None, crashed
        assert "--chat-template-file" in crashed["reason"] and "model_dirs" in crashed["reason"], crashed
        assert key not in json.dumps(crashed)
        # `serve start` with it: bob's own process resolves the name before its launch and refuses in one line.
        refused = shared.run("bob", "serve", "start", str(bobs), "--model", str(shared.model), "--alias", "b4", "--",
                             "--chat-template-file", str(uploads / "t.jinja"))
        assert refused.returncode == 2 and refused.stderr == (
            f"board: extra argument --chat-template-file: {uploads / 't.jinja'} is not a file under [llama] model_dirs"
            " (symlinks resolved)\n"), refused.stderr

        # The same flag with a file that does lie there works: llama-server reads the descriptor it was given.
        template = shared.model.parent / "plain.jinja"
        template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
        os.chmod(template, 0o644)
        later = shared.json("bob", "book", "--cards", "3", "--for", "1h")["id"]
        assert "id" in _call_as("bob", shared, "serve_plan", booking=later, model=str(shared.model), ctx=256,
                                alias="b3", extra=["--chat-template-file", str(template)])["ok"]
        bob = self._wait_ready(shared, runner, later)
        bobs_key = shared.json("bob", "serve", "key", str(bob["id"]))["key"]
        props = json.loads(_request(bob, "/props", key=bobs_key).read())
        assert props["chat_template"] == template.read_text() and key not in json.dumps(props)
        assert _request(alice, "/v1/completions", {"prompt": "hi", "max_tokens": 2}, key=bobs_key).status == 401
        assert not [f for f in _files_under(state) if f.suffix == ".key"]
        for server in (alice, bob):
            shared.json(server["user"], "serve", "stop", str(server["id"]))
            assert gone(server)
