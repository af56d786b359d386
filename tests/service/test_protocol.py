"""The wire against the real socket, spoken by hand: bad requests get error replies and the service keeps serving.

Every test here runs the real agent as user board (root needed; skipped with the reason otherwise).
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import socket
import struct
import subprocess
import sys
import termios
import threading
import time

import pytest

from app import wire
from app.client.socket import SocketClient
from app.errors import BoardError
from app.service.door.server import LINE_TIMEOUT_S
from tests.agent_process import PRLIMIT, SETPRIV
from tests.service.support import BOARD, SERVICE_USER, Raw, board_cli, check_reachable, ensure_outsider, run_as

pytestmark = pytest.mark.real_users

HOUR = 3600


def error_of(reply: dict, code: int) -> str:
    assert reply["ok"] is False, reply
    assert reply["error"]["code"] == code, reply
    message = reply["error"]["message"]
    assert isinstance(message, str) and message and "\n" not in message and "Traceback" not in message
    return message


def still_serves(raw: Raw) -> None:
    reply = raw.request("whoami")
    assert reply["ok"] is True and reply["result"]["user"] == "root", reply


def answers_quickly(agent, limit: float = 5.0) -> float:
    """Another client's request (a write, so it passes the database thread) answers within `limit` seconds."""
    began = time.monotonic()
    client = agent.client(timeout=limit)
    try:
        start = (int(time.time()) // HOUR + 24) * HOUR
        client.call("whoami")
        client.call("book", count=1, start=start, end=start + 60)
    finally:
        client.close()
    took = time.monotonic() - began
    assert took < limit, f"another client waited {took:.1f} s"
    return took


# -- bad requests, and the connection goes on -----------------------------------------------------


def test_bad_json_is_code_2_and_the_connection_still_serves(agent):
    raw = Raw(agent.socket)
    for junk in (b"{not json\n", b"\xff\xfe\n", b"[1, 2, 3]\n", b'"a string"\n', b"\n", b"{}\n"):
        raw.send(junk)
        reply = raw.reply()
        assert reply["id"] is None
        error_of(reply, 2)
        still_serves(raw)


def test_deeply_nested_json_is_code_2(agent):
    raw = Raw(agent.socket)
    raw.send(b"[" * 200_000 + b"]" * 200_000 + b"\n")
    error_of(raw.reply(), 2)
    still_serves(raw)


def test_unknown_operation_is_code_2_and_names_the_known_ones(agent):
    raw = Raw(agent.socket)
    reply = raw.request("frobnicate", {})
    assert reply["id"] == 1
    message = error_of(reply, 2)
    assert "frobnicate" in message and "book" in message
    error_of(raw.request(None), 2)
    error_of(raw.request(12), 2)
    still_serves(raw)


@pytest.mark.parametrize("op, args, words", [
    ("cancel", {}, "missing argument 'id'"),
    ("book", {"start": 1, "cards": [0]}, "missing argument 'end'"),
    ("cancel", {"id": "7"}, "must be int"),
    ("cancel", {"id": 1.5}, "must be int"),
    ("cancel", {"id": True}, "must be int"),
    ("cancel", {"id": 2**70}, "out of range"),
    ("book", {"start": 1, "end": 2, "cards": "0,1"}, "must be list"),
    ("book", {"start": 1, "end": 2, "cards": ["0"]}, "card numbers"),
    ("list", {"mine": "yes"}, "must be bool"),
    ("cancel", {"id": 1, "reason": "x"}, "unknown argument 'reason'"),
    ("cancel", [1], "must be a JSON object"),
    ("cancel", "1", "must be a JSON object"),
])
def test_missing_or_mistyped_arguments_are_code_2(agent, op, args, words):
    raw = Raw(agent.socket)
    assert words in error_of(raw.request(op, args), 2)
    still_serves(raw)


@pytest.mark.parametrize("version", [2, 0, "1", None, [1]])
def test_a_wrong_protocol_version_names_the_versions_spoken(agent, version):
    raw = Raw(agent.socket)
    reply = raw.request("whoami", v=version)
    message = error_of(reply, 2)
    assert reply["id"] == 1
    assert "speaks 1" in message, message
    still_serves(raw)


def test_request_without_a_version(agent):
    raw = Raw(agent.socket)
    raw.send(json.dumps({"id": 9, "op": "whoami"}).encode() + b"\n")
    reply = raw.reply()
    assert reply["id"] == 9 and "speaks 1" in error_of(reply, 2)


def test_requests_on_one_connection_are_answered_in_order_with_their_ids(agent):
    raw = Raw(agent.socket)
    raw.send(b"".join(json.dumps({"v": 1, "id": f"r{i}", "op": "whoami"}).encode() + b"\n" for i in range(20)))
    assert [raw.reply()["id"] for _ in range(20)] == [f"r{i}" for i in range(20)]


def test_a_message_over_1_mib_gets_an_error_then_the_connection_closes(agent):
    big = Raw(agent.socket)
    line = json.dumps({"v": 1, "id": 1, "op": "book", "args": {"note": "x" * (wire.MAX_MESSAGE + 10)}}).encode() + b"\n"
    # The service stops reading at the cap, so the rest may never be taken: send from a thread.
    sender = threading.Thread(target=_send_ignoring_errors, args=(big.sock, line), daemon=True)
    sender.start()
    message = error_of(big.reply(), 2)
    assert str(wire.MAX_MESSAGE) in message
    assert big.closed(), "the connection stays open after an oversized message"
    sender.join(10)
    # ... and everyone else is still served.
    other = Raw(agent.socket)
    still_serves(other)
    answers_quickly(agent)


def test_a_message_just_under_the_cap_is_read(agent):
    raw = Raw(agent.socket)
    head = json.dumps({"v": 1, "id": 1, "op": "whoami", "pad": ""}).encode()
    pad = wire.MAX_MESSAGE - len(head) - 1  # with its newline, exactly MAX_MESSAGE bytes
    line = head[:-2] + b"x" * pad + b'"}\n'
    assert len(line) == wire.MAX_MESSAGE
    raw.send(line)
    reply = raw.reply()
    assert reply["ok"] is True, reply


def _send_ignoring_errors(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass


# -- clients that misbehave never hold up anyone else ---------------------------------------------


def _unread_bytes(sock: socket.socket) -> int:
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]


def test_silent_and_stalled_clients_never_block_others(make_agent):
    # Fleet snapshots every 20 ms fill a subscriber's socket quickly when it never reads.
    agent = make_agent(display={"refresh_seconds": 0.02})
    silent = [Raw(agent.socket) for _ in range(3)]  # connect and say nothing
    half = Raw(agent.socket)
    half.send(b'{"v": 1, "id": 1, "op": "who')  # half a request, and then nothing
    stalled = Raw(agent.socket)
    stalled.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.send(json.dumps({"v": 1, "id": 1, "op": "subscribe", "args": {"kinds": ["fleet", "bookings"]}}).encode()
                 + b"\n")
    # Wait until its buffer stops growing: the service's sender to it is then blocked in sendall.
    deadline, last, steady = time.monotonic() + 8, -1, 0
    while time.monotonic() < deadline and steady < 3:
        time.sleep(0.2)
        now = _unread_bytes(stalled.sock)
        steady = steady + 1 if now == last and now > 0 else 0
        last = now
    assert steady >= 3 and last > 4096, f"the stalled subscriber's buffer did not fill ({last} bytes)"
    # Bookings change while it is stuck: every change is offered to it too.
    for _ in range(5):
        answers_quickly(agent)
    rc, out, err = board_cli("book", "1", "--start", "tomorrow 12:00", "--for", "1h",
                             env={"BOARD_CONFIG": str(agent.config)}, timeout=10)
    assert rc == 0, err
    # A well-behaved subscriber beside them still gets the change pushed.
    reader = Raw(agent.socket)
    reply = reader.request("subscribe", {"kinds": ["bookings"]})
    assert reply["ok"] is True and "bookings" in reply["result"]["versions"]
    answers_quickly(agent)
    event = reader.reply()
    assert event["event"] == "bookings"
    for raw in silent:  # the silent ones were never dropped for the others' sake
        still_serves(raw)
    for raw in (*silent, half, stalled, reader):
        raw.close()


def test_a_client_left_idle_past_the_timeout_still_books(make_agent):
    """The service closes an idle line; the client's next request, a write too, goes out on a new one:
    a request that could not be sent was never read, so sending it again cannot book twice."""
    agent = make_agent(service={"idle_timeout_s": 1})
    client = SocketClient(str(agent.socket))
    try:
        assert client.call("whoami")["user"] == "root"
        time.sleep(2.5)  # past the idle timeout: the service has closed this client's line
        tomorrow = int(time.time()) + 86400
        booked = client.call("book", count=1, start=tomorrow, end=tomorrow + HOUR)
        assert [b["id"] for b in client.call("list", include_cancelled=True, start=0)["bookings"]] == [booked["id"]]
    finally:
        client.close()


def test_a_client_that_disappears_mid_request_costs_nothing(agent):
    for _ in range(20):
        raw = Raw(agent.socket)
        raw.send(b'{"v": 1, "id": 1, "op": "book", "args": {"start"')
        raw.sock.shutdown(socket.SHUT_RDWR)
        raw.close()
    answers_quickly(agent)


# -- the per-uid cap --------------------------------------------------------------------------------


def _admitted(agent, within: float = 5.0) -> Raw:
    """A connection the service admitted (one it counted a moment ago, such as the start-up probe, may still be closing)."""
    deadline = time.monotonic() + within
    while True:
        raw = Raw(agent.socket)
        try:
            still_serves(raw)
            return raw
        except (AssertionError, ConnectionError):
            raw.close()
            assert time.monotonic() < deadline, "no connection admitted"
            time.sleep(0.1)


def test_the_connection_cap_per_uid_refuses_the_next_with_one_line(make_agent):
    agent = make_agent(service={"max_connections_per_uid": 4})
    held = [_admitted(agent) for _ in range(4)]
    fifth = Raw(agent.socket)
    message = error_of(fifth.reply(), 1)
    assert "too many connections" in message and "at most 4" in message
    assert fifth.closed(), "the refused connection stays open"
    # The CLI says so in one line too.
    rc, out, err = board_cli("whoami", env={"BOARD_CONFIG": str(agent.config)}, timeout=10)
    assert rc == 1 and len(err.splitlines()) == 1 and "too many connections" in err, (rc, err)
    # ... also when the refusal and the close come before the client has sent its request.
    slow = SlowClient(str(agent.socket), timeout=10)
    with pytest.raises(BoardError, match="too many connections"):
        slow.call("whoami")
    # A llama-server's supervisor registering past the cap says why (and stops its server), whichever came first.
    from app.llama.supervisor import _SocketReporter

    with pytest.raises(RuntimeError, match="refused server 1: too many connections"):
        _SocketReporter({"socket": str(agent.socket), "server": 1, "log": "", "backstop": 0}, None, api_key="")
    # One closed, one more admitted; the others were never dropped.
    held.pop().close()
    held.append(_admitted(agent))
    for raw in held:
        still_serves(raw)


def trickle(raw: Raw, most: int, every_s: float = 0.5) -> int:
    """A byte (never a whole line) every `every_s` until the service answers or closes: the bytes sent by then,
    or `most` + 1 when it never did."""
    poller = select.poll()
    poller.register(raw.sock, select.POLLIN)
    for sent in range(most + 1):
        if poller.poll(int(every_s * 1000)):
            return sent
        try:
            raw.send(b" ")
        except OSError:
            return sent
    return most + 1


def test_over_the_cap_the_refusal_comes_at_once_and_nothing_is_read(make_agent):
    agent = make_agent(service={"max_connections_per_uid": 2})
    held = [_admitted(agent) for _ in range(2)]
    third = Raw(agent.socket)
    # A door that waited for the first request, a recv at a time, would wait on this one for ever.
    assert trickle(third, most=20) <= 20, "no refusal while the client trickled"
    assert "too many connections" in error_of(third.reply(), 1)
    assert third.closed()
    for raw in held:
        still_serves(raw)


def test_the_global_cap_counts_everyone_s_connections(make_agent):
    agent = make_agent(service={"max_connections": 3})
    held = [_admitted(agent) for _ in range(3)]
    message = error_of(Raw(agent.socket).reply(), 1)
    assert "too many connections (at most 3)" in message, message
    held.pop().close()
    held.append(_admitted(agent))
    for raw in held:
        still_serves(raw)


def test_a_request_line_has_one_deadline_however_slowly_its_bytes_come(agent):
    slow = Raw(agent.socket)
    most = int(2 * LINE_TIMEOUT_S / 0.5)  # a byte every 0.5 s for twice the deadline; each recv waits 0.5 s only
    assert trickle(slow, most) <= most, "a line trickled a byte at a time was never cut off"
    assert slow.closed()
    answers_quickly(agent)


def soft_file_limit(pid: int, soft: int | None = None) -> int:
    """The process's soft open-file limit; with `soft`, set first (as its own user board: root here may lack
    CAP_SYS_RESOURCE, which changing another user's limits takes)."""
    if soft is not None:
        subprocess.run([SETPRIV, "--reuid", SERVICE_USER, "--regid", SERVICE_USER, "--clear-groups", PRLIMIT,
                        "--pid", str(pid), f"--nofile={soft}:"], check=True, capture_output=True)
    with open(f"/proc/{pid}/limits") as limits:
        return int(next(line for line in limits if line.startswith("Max open files")).split()[3])


def test_out_of_files_at_accept_is_logged_once_and_passes(agent):
    """accept() failing with EMFILE (here: its limit lowered under it to its highest open file) waits and goes on."""
    pid, failing = agent.proc.pid, "can't accept connections (Too many open files, EMFILE"
    answers_quickly(agent)  # past its start (the socket answers before the agent has loaded all it serves with)
    held = _admitted(agent)  # a file to give back later
    before = soft_file_limit(pid)
    assert soft_file_limit(pid, max(int(fd) for fd in os.listdir(f"/proc/{pid}/fd")) + 1) < before
    waiting: list[Raw] = []
    try:
        def starved() -> bool:  # one more connection, until the service has no file left to accept it with
            assert agent.proc.poll() is None, agent.log_text()
            waiting.append(Raw(agent.socket))
            waiting[-1].send(json.dumps({"v": 1, "id": 1, "op": "whoami"}).encode() + b"\n")
            return failing in agent.log_text()

        deadline = time.monotonic() + 30
        while not starved():
            assert time.monotonic() < deadline, agent.log_text()
            time.sleep(0.1)
        last = waiting.pop()  # connected, and waiting in the backlog for a file
        for raw in (held, *waiting):  # give files back
            raw.close()
        assert last.reply()["result"]["user"] == "root"
    finally:
        if agent.proc.poll() is None:
            soft_file_limit(pid, before)
    answers_quickly(agent)
    log = agent.log_text()
    assert log.count("can't accept connections") == 1 and "Traceback" not in log, log


class SlowClient(SocketClient):
    """A SocketClient that sends its first request only after the service has had time to answer at the door."""

    def connect(self):
        sock = super().connect()
        time.sleep(0.5)
        return sock


# -- who may connect -----------------------------------------------------------------------------------


def test_a_non_member_is_refused_with_code_4(agent):
    mallory = ensure_outsider("mallory")
    check_reachable("mallory")
    # The socket's mode (0660, group board) keeps mallory out before the service sees him:
    rc = run_as("mallory", str(BOARD), "whoami",
                env={"PATH": "/usr/bin:/bin", "BOARD_CONFIG": str(agent.config), "TZ": "UTC", "HOME": "/"})
    assert rc.returncode == 4, (rc.returncode, rc.stderr)
    assert len(rc.stderr.splitlines()) == 1 and "no access" in rc.stderr and "Traceback" not in rc.stderr
    # ... and with the mode opened by mistake, the service's own check refuses him.
    os.chmod(agent.socket, 0o666)
    probe = (
        "import json, socket, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(10); s.connect(sys.argv[1])\n"
        "try:\n"
        "    s.sendall(b'{\"v\": 1, \"id\": 1, \"op\": \"list\"}\\n')\n"
        "except OSError:\n"
        "    pass\n"
        "f = s.makefile('rb'); print(f.readline().decode().strip())\n"
        "try:\n"
        "    print(repr(f.readline()))\n"
        "except ConnectionResetError:\n"
        "    print(repr(b''))\n"
    )
    result = run_as("mallory", sys.executable, "-c", probe, str(agent.socket), env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    first, rest = result.stdout.splitlines()
    reply = json.loads(first)
    assert "group board" in error_of(reply, 4)
    assert rest == "b''", "the service kept talking to a non-member"
    assert mallory.pw_uid not in {e["uid"] for e in agent.client().call("log", limit=100)}


def test_a_refusal_leaves_without_its_earliest_start_and_the_client_asks_for_it(agent):
    """The wire: a refused book says why and carries the search (`earliest`) for the costly second half, which the
    service words only when asked (op earliest): a client that never shows the refusal never pays for it, and one
    that shows it (the CLI, the board) shows the same message as before."""
    raw = Raw(agent.socket)
    start = (int(time.time()) // HOUR + 24) * HOUR
    assert raw.request("book", {"cards": [5], "start": start, "end": start + 2 * HOUR})["ok"] is True
    reply = raw.request("book", {"cards": [5], "start": start + HOUR, "end": start + 2 * HOUR})
    message = error_of(reply, 3)
    assert "booked by root" in message and "next free start" not in message
    search = reply["error"]["earliest"]
    assert search == {"cards": [5], "class": "experiment", "start": start + HOUR, "duration": HOUR}
    words = raw.request("earliest", search)["result"]["words"]
    assert words.startswith("next free start for cards 5: ")
    client = agent.client()
    try:
        with pytest.raises(BoardError) as refused:
            client.call("book", cards=[5], start=start + HOUR, end=start + 2 * HOUR)
        shown = str(refused.value)  # the client asks for the second half now
        assert shown.startswith("card 5 is booked by root from ") and "; next free start for cards 5: " in shown
    finally:
        client.close()
    still_serves(raw)
