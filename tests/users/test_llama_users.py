"""bob cannot stop alice's llama-server; carol (admin) can; all as real Unix users, through the service.

A stand-in llama-server (a few lines of Python that answer /health) keeps this independent of the
real binary; tests/llama covers the real one (tests/llama/test_servers_service.py over the socket).
alice's supervisor registers with the service, which signals it only through its pidfd. pytest
becomes a child subreaper here, so the detached supervisors are re-parented to it and can be reaped.
"""

from __future__ import annotations

import ctypes
import json
import os
import pwd
import sys
import time
from pathlib import Path

import pytest

from tests.ports import port_range
from tests.users.conftest import wait_for


FAKE_SERVER = """\
#!{python}
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{{}}")
    def log_message(self, *args):
        pass
print("stand-in llama-server on", port, flush=True)
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def write_stand_ins(folder: Path) -> tuple[Path, Path]:
    """A stand-in llama-server and a GGUF-looking model in `folder`, that everyone (and the service) can read."""
    server_bin = folder / "llama-server"
    server_bin.write_text(FAKE_SERVER.format(python=sys.executable))
    os.chmod(server_bin, 0o755)
    model = folder / "tiny.gguf"
    model.write_bytes(b"GGUF" + bytes(64))
    os.chmod(model, 0o644)
    return server_bin, model


@pytest.fixture
def serving(make_board, scratch):
    """The shared board, with a stand-in llama-server and a GGUF-looking model everyone (and the service) can read."""
    ctypes.CDLL(None, use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    server_bin, model = write_stand_ins(scratch)
    port_min, port_max = port_range("llama_users", 20)
    board = make_board(extra=f'\n[llama]\nserver_bin = "{server_bin}"\nport_min = {port_min}\nport_max = {port_max}\n'
                             f'ready_timeout_s = 30\n')
    board.model = model
    return board


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def alive(pid: int) -> bool:
    reap()
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_bob_cannot_stop_alices_server_and_carol_can(serving):
    board = serving
    booking = board.book("alice", "--cards", "0", "--for", "1h")
    started = board.run("alice", "serve", "start", str(booking["id"]), "--model", str(board.model), "--ctx", "256",
                        "--json")
    assert started.returncode == 0, started.stderr
    server = json.loads(started.stdout)
    assert server["user"] == "alice" and server["state"] == "ready", server
    assert pwd.getpwuid(os.stat(f"/proc/{server['pid']}").st_uid).pw_name == "alice"

    # bob: not his server, not his booking; exit 4, one line, audited, and the server keeps running
    for args in (["serve", "stop", str(server["id"])],
                 ["serve", "start", str(booking["id"]), "--model", str(board.model)]):
        refused = board.run("bob", *args)
        assert refused.returncode == 4, refused.stderr
        assert len(refused.stderr.splitlines()) == 1 and "alice" in refused.stderr
    assert alive(server["pid"])
    listed = board.json("bob", "serve", "list")["servers"]
    assert [(s["id"], s["state"]) for s in listed] == [(server["id"], "ready")]
    bob = pwd.getpwnam("bob").pw_uid
    log = board.json("carol", "log", "--limit", "100")["events"]
    refusals = sorted(e["action"] for e in log if e["uid"] == bob and not e["ok"])
    assert refusals == ["server-start", "server-stop"], log

    # Her log is hers and admins' (it may hold the prompts the gateway relayed): bob is refused, in one line, and
    # carol, an admin, reads the lines alice's supervisor sent to the service (the service never opens her file;
    # they reach it as the supervisor sends them, so the first answer may come before them)
    refused = board.run("bob", "serve", "logs", str(server["id"]))
    assert refused.returncode == 4 and refused.stdout == "", refused
    assert refused.stderr.splitlines() == [f"board: server {server['id']} belongs to alice; only they or an admin can"
                                           " read its log"], refused.stderr
    logged = lambda: board.run("carol", "serve", "logs", str(server["id"]))  # noqa: E731
    assert wait_for(lambda: "stand-in llama-server on" in logged().stdout, 15), logged().stderr
    assert logged().returncode == 0

    # carol, an admin but not root: the service stops it through the supervisor's pidfd
    assert board.json("carol", "whoami")["admin"] is True
    stopped = board.run("carol", "serve", "stop", str(server["id"]), "--json")
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout)["state"] == "stopped"
    deadline = time.monotonic() + 15
    while alive(server["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(server["pid"])
    carol = pwd.getpwnam("carol").pw_uid
    log = board.json("alice", "log", "--limit", "100")["events"]
    assert any(e["action"] == "server-stop" and e["ok"] and e["uid"] == carol for e in log), log
    # alice's server log is her own file (her supervisor wrote it), not in the service's directory
    st = os.stat(server["log"])
    assert st.st_uid == pwd.getpwnam("alice").pw_uid and not server["log"].startswith(str(board.dir))


def test_a_booking_given_to_bob_does_not_keep_alices_server_on_it(serving):
    """Issue 31 §8: carol (admin) gives alice's booking to bob while alice's server runs on it. Refused (exit 3,
    one line saying what to do) and the server serves on; with --force alice's piece ends now, the service stops
    her server through its pidfd, and bob holds the rest of the booking with no one's server on his card."""
    board = serving
    booking = board.book("alice", "--cards", "0", "--for", "1h")
    started = board.run("alice", "serve", "start", str(booking["id"]), "--model", str(board.model), "--ctx", "256",
                        "--json")
    assert started.returncode == 0, started.stderr
    server = json.loads(started.stdout)
    refused = board.run("carol", "admin", "reassign", str(booking["id"]), "--user", "bob")
    assert refused.returncode == 3, refused.stderr
    assert refused.stderr.splitlines() == [
        f"board: booking {booking['id']} has server {server['id']} running on cards 0; stop it first, or pass --force"
        " to stop it and give the booking to bob"], refused.stderr
    assert alive(server["pid"]) and board.json("alice", "list", "--mine")["bookings"][0]["id"] == booking["id"]

    time.sleep(1.1)  # a second of the booking is past: alice's piece stays as history
    given = board.json("carol", "admin", "reassign", str(booking["id"]), "--user", "bob", "--force")
    assert (given["user"], given["cards"]) == ("bob", [0]) and given["id"] != booking["id"]
    deadline = time.monotonic() + 15
    while alive(server["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(server["pid"])
    listed = board.json("bob", "serve", "list")["servers"]
    assert [(s["id"], s["booking_id"], s["state"]) for s in listed] == [(server["id"], booking["id"], "stopped")]
    stops = [e for e in board.json("carol", "log", "--limit", "100")["events"]
             if e["action"] == "server-stop" and e["booking_id"] == booking["id"]]
    assert stops and stops[0]["ok"], stops
