"""Floods do not take the service down (issue 17, section 1), tried as the hostile accounts would, against the
agent started as the unit starts it at systemd's default soft limit of 1,024 open files.

- bob (a member) holds 1,500 connections to the socket, each sending one byte every 1.5 s and opened again
  whenever the service closes it;
- mallory (no member) holds 1,500 half-open `GET /metrics` requests the same way.

Meanwhile the agent stays up, its threads stay within its caps, and alice's `board whoami` answers within 5 s.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

from app.service.box.metrics import MAX_SCRAPES
from app.service.door.server import LINE_TIMEOUT_S
from tests.users.conftest import wait_for

FLOODERS = 1500
TICK_S = 1.5

# argv: the socket (a path) or host and port; opens FLOODERS connections, then every TICK_S sends each one byte
# (never a whole request) and opens again those the service closed, printing "tick <closed> <failed to open>".
FLOOD = f"""
import resource, socket, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
unix = len(sys.argv) == 2

def opened():
    sock = socket.socket(socket.AF_UNIX) if unix else socket.socket()
    sock.settimeout(2)
    try:
        sock.connect(sys.argv[1] if unix else (sys.argv[1], int(sys.argv[2])))
        sock.send(b"{{" if unix else b"GET /metrics HTTP/1.1\\r\\n")
    except OSError:
        sock.close()
        return None
    return sock

conns = [opened() for _ in range({FLOODERS})]
while True:
    began = time.monotonic()
    closed = failed = 0
    for i, sock in enumerate(conns):
        if sock is not None:
            try:
                sock.send(b" " if unix else b"X")
                continue
            except OSError:
                sock.close()
                closed += 1
        conns[i] = opened()
        failed += conns[i] is None
    print("tick", closed, failed, flush=True)
    time.sleep(max(0.0, {TICK_S} - (time.monotonic() - began)))
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def threads_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("Threads:")).split()[1])


def sockets_of(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            pass  # closed meanwhile
    return count


class Flood:
    """A flooder running as `user`, its tick lines collected as they come."""

    def __init__(self, board, user: str, *args: str) -> None:
        self.process = board.spawn(user, *args, program=[sys.executable, "-c", FLOOD], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        self.ticks: list[tuple[int, int]] = []
        self.other: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            word, *numbers = line.split()
            if word == "tick" and len(numbers) == 2:
                self.ticks.append((int(numbers[0]), int(numbers[1])))
            else:
                self.other.append(line)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)


class Peaks:
    """The agent's threads and sockets, read from /proc every 0.1 s on a thread of its own: the most of each."""

    def __init__(self, pid: int) -> None:
        self.pid, self.threads, self.sockets = pid, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self.threads = max(self.threads, threads_of(self.pid))
                self.sockets = max(self.sockets, sockets_of(self.pid))
            except OSError:
                return  # the agent is gone: the test says so

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def test_a_members_socket_flood_and_an_outsiders_metrics_flood_leave_the_agent_up_and_answering(make_board):
    port = free_port()
    board = make_board(f'\n[metrics]\nlisten = "127.0.0.1:{port}"\n', nofile="1024:1024")
    pid = board.agent.pid
    with open(f"/proc/{pid}/limits") as limits:
        assert next(line for line in limits if line.startswith("Max open files")).split()[3:5] == ["1024", "1024"]
    assert board.json("alice", "whoami")["user"] == "alice"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as scrape:
        scrape.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        assert scrape.recv(100).startswith(b"HTTP/1.0 200")
    idle_threads, idle_sockets = threads_of(pid), sockets_of(pid)

    peaks = Peaks(pid)
    floods = [Flood(board, "bob", str(board.socket)), Flood(board, "mallory", "127.0.0.1", str(port))]
    try:
        assert wait_for(lambda: all(len(f.ticks) >= 2 for f in floods), timeout=60), \
            [(f.ticks, f.other[-3:]) for f in floods]
        assert board.agent.poll() is None
        began = time.monotonic()
        whoami = board.run("alice", "whoami", "--json", timeout=60)
        took = time.monotonic() - began
        assert whoami.returncode == 0 and json.loads(whoami.stdout)["user"] == "alice", whoami.stderr
        assert took < 5, f"alice's whoami took {took:.1f} s during the floods"
        # bob's own board, past his cap, gets one line (or a slot his flood's timed-out line just left).
        mine = board.run("bob", "whoami", timeout=60)
        assert mine.returncode == 0 or (mine.returncode == 1 and len(mine.stderr.splitlines()) == 1
                                        and "too many connections from bob" in mine.stderr), mine.stderr
        # On, past the line deadline, when the connections bob got in are cut off and replaced.
        assert wait_for(lambda: len(floods[0].ticks) >= LINE_TIMEOUT_S / TICK_S + 2, timeout=60)
        assert board.agent.poll() is None
    finally:
        peaks.stop()
        for flood in floods:
            flood.stop()
    print(f"\nflood: agent threads {idle_threads} idle, {peaks.threads} at most; sockets {idle_sockets} idle,"
          f" {peaks.sockets} at most; alice's whoami {took:.2f} s; bob's ticks (closed by the service, refused"
          f" at once) {floods[0].ticks}; mallory's {floods[1].ticks}")
    # bob's cap, the /metrics pool and the whoamis, over the idle agent's (and a few threads just ending as the
    # connections that replace them start).
    assert peaks.threads <= idle_threads + 64 + MAX_SCRAPES + 8, (idle_threads, peaks.threads)
    assert board.json("alice", "whoami")["user"] == "alice"
    assert "Traceback" not in board.agent_log.read_text()


def test_the_agent_raises_its_soft_file_limit_to_the_hard_one(make_board):
    board = make_board(nofile="1024:4096")
    with open(f"/proc/{board.agent.pid}/limits") as limits:
        assert next(line for line in limits if line.startswith("Max open files")).split()[3:5] == ["4096", "4096"]
