"""The service going away: down says so in one line and never falls back to the file; a kill -9 loses
nothing that was acknowledged, and subscribers see `down`, then `reconnected`."""

from __future__ import annotations

import os
import queue
import re
import socket
import sys
import threading
import time

import pytest

from app.errors import BoardError, ServiceDown
from tests.service.support import board_cli, needs_root

DOWN_LINE = "board: the board service is not running (systemctl status board-agent)\n"
HOUR = 3600


# -- the service is down --------------------------------------------------------------------------


def _config(tmp_path, socket_path) -> dict:
    db = tmp_path / "lib" / "board.db"
    (tmp_path / "lib").mkdir()
    config = tmp_path / "board.toml"
    config.write_text(f'[storage]\ndb = "{db}"\n\n[service]\nsocket = "{socket_path}"\n')
    return {"BOARD_CONFIG": str(config), "HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}


def _assert_down_and_no_file(tmp_path, env, *commands):
    for args in commands:
        rc, out, err = board_cli(*args, env=env)
        assert (rc, out, err) == (1, "", DOWN_LINE), args
    assert list((tmp_path / "lib").iterdir()) == [], "the CLI fell back to the database file"
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").rglob("*.db"))


COMMANDS = (("status",), ("status", "--json"), ("list",), ("whoami",), ("book", "1", "--for", "1h"), ("cancel", "1"),
            ("log",))


def test_no_socket_file_says_not_running_in_one_line(tmp_path):
    env = _config(tmp_path, tmp_path / "run" / "board.sock")
    _assert_down_and_no_file(tmp_path, env, *COMMANDS)


def test_a_stale_socket_nobody_serves_says_not_running(tmp_path):
    path = tmp_path / "board.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: ECONNREFUSED
    assert path.exists()
    env = _config(tmp_path, path)
    _assert_down_and_no_file(tmp_path, env, *COMMANDS)


def test_the_socket_client_raises_service_down(tmp_path):
    from app.client.socket import SocketClient

    client = SocketClient(str(tmp_path / "nobody.sock"))
    with pytest.raises(ServiceDown) as down:
        client.call("whoami")
    assert down.value.exit_code == 1
    assert str(down.value) == DOWN_LINE[len("board: "):].strip()


# -- the agent's own start and stop ---------------------------------------------------------------


def test_the_agent_refuses_to_run_as_root(make_agent):
    agent = make_agent(start=False)
    rc, out, err = board_cli("agent", env={"BOARD_CONFIG": str(agent.config), "BOARD_SIMULATE": "1"}, timeout=30)
    assert rc == 1 and "does not run as root" in err and len(err.splitlines()) == 1, (rc, err)
    assert not agent.socket.exists() and not agent.db.exists()


def test_sigterm_stops_the_agent_and_removes_its_socket(agent):
    assert oct(agent.socket.stat().st_mode & 0o777) == "0o660"
    assert agent.socket.stat().st_gid == __import__("grp").getgrnam("board").gr_gid
    assert oct(agent.db.parent.stat().st_mode & 0o777) == "0o700"
    client = agent.client()
    assert client.call("whoami")["transport"] == "socket"
    assert agent.stop() == 0
    assert not agent.socket.exists()
    rc, out, err = board_cli("status", env={"BOARD_CONFIG": str(agent.config)})
    assert (rc, err) == (1, DOWN_LINE)
    with pytest.raises(ServiceDown):
        client.call("whoami")
    client.close()


def test_a_second_agent_on_the_same_socket_refuses_to_start(agent):
    from tests.service.support import Agent

    twin = Agent(agent.root, agent.settings, agent.display)
    twin.spawn()
    assert twin.proc.wait(30) == 1
    assert "another board service already answers" in twin.log_text()
    assert agent.client().call("whoami")["user"] == "root"  # the first still serves


# -- kill -9 mid-load -----------------------------------------------------------------------------


class Booker(threading.Thread):
    """Books one card, slot after slot, as fast as the service answers; remembers what was acknowledged."""

    def __init__(self, agent, card: int, base: int, stop: threading.Event):
        super().__init__(daemon=True)
        self.agent, self.card, self.base, self.stop = agent, card, base, stop
        self.acked: dict[int, tuple[int, int]] = {}  # booking id -> (card, start)
        self.failures: list[str] = []
        self.unexpected: list[str] = []

    def run(self) -> None:
        client = self.agent.client(timeout=10)
        slot = 0
        try:
            while not self.stop.is_set():
                start = self.base + slot * 600
                slot += 1
                try:
                    booking = client.call("book", cards=[self.card], start=start, end=start + 600)
                except BoardError as error:  # down, or stopped mid-answer: not acknowledged
                    if not isinstance(error, ServiceDown):
                        self.unexpected.append(f"{type(error).__name__}: {error}")
                    self.failures.append(str(error))
                    time.sleep(0.05)
                    continue
                self.acked[booking["id"]] = (booking["cards"][0], booking["start"])
        finally:
            client.close()


def test_kill_9_mid_load_loses_nothing_acknowledged_and_subscribers_reconnect(agent):
    needs_root()
    base = (int(time.time()) // HOUR + 24) * HOUR
    events: queue.Queue = queue.Queue()
    watcher = agent.client()

    def watch():
        for event in watcher.subscribe(("bookings",)):
            events.put(event)

    threading.Thread(target=watch, daemon=True).start()
    stop = threading.Event()
    bookers = [Booker(agent, card, base, stop) for card in range(4)]
    for booker in bookers:
        booker.start()
    try:
        _wait_until(lambda: sum(len(b.acked) for b in bookers) >= 40, 30, "bookings before the kill")
        agent.kill9()
        before = sum(len(b.acked) for b in bookers)
        _wait_until(lambda: sum(len(b.failures) for b in bookers) >= 4, 15, "clients noticing the service is gone")
        agent.start()
        _wait_until(lambda: sum(len(b.acked) for b in bookers) >= before + 40, 30, "bookings after the restart")
    finally:
        stop.set()
        for booker in bookers:
            booker.join(20)

    seen = []
    deadline = time.monotonic() + 15
    while "reconnected" not in seen and time.monotonic() < deadline:
        try:
            seen.append(events.get(timeout=0.5)["event"])
        except queue.Empty:
            pass
    watcher.close()
    assert "down" in seen and "reconnected" in seen, seen
    assert seen.index("down") < seen.index("reconnected"), seen
    assert seen.count("down") == 1, seen  # one `down` for the outage, not one per retry

    for booker in bookers:
        assert booker.unexpected == [], booker.unexpected  # distinct cards and slots: never a conflict
    acked = {i: slot for booker in bookers for i, slot in booker.acked.items()}
    client = agent.client()
    stored = client.call("list", start=0, include_cancelled=True)["bookings"]
    ids = [b["id"] for b in stored]
    assert len(ids) == len(set(ids)), "two bookings share an id"
    found = {b["id"]: (b["cards"][0], b["start"]) for b in stored}
    lost = {i: slot for i, slot in acked.items() if found.get(i) != slot}
    assert not lost, f"{len(lost)} acknowledged bookings are missing or changed after kill -9: {sorted(lost)[:10]}"
    created = {e["booking_id"] for e in client.call("log", limit=1_000_000) if e["action"] == "create" and e["ok"]}
    assert set(acked) <= created, "acknowledged bookings lost their audit events"
    # Each card's slots never overlap, whatever landed unacknowledged.
    for card in range(4):
        starts = sorted(b["start"] for b in stored if b["cards"] == [card])
        assert len(starts) == len(set(starts))
    client.close()


def _wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_socket_client_reconnects_for_reads_after_a_restart(agent):
    client = agent.client()
    assert client.call("whoami")["user"] == "root"
    agent.kill9()
    with pytest.raises(ServiceDown):
        client.call("whoami")
    agent.start()
    assert client.call("whoami")["user"] == "root"  # a fresh connection, no new client needed
    assert os.path.exists(agent.socket)
    client.close()


def test_the_agent_names_the_store_it_serves_on(store, make_agent):
    """Its start-up line names the PostgreSQL database (host:port/dbname, never a password) on a PostgreSQL store, not
    the SQLite file it does not use; the file on SQLite."""
    url = getattr(store, "url", None)
    agent = make_agent(storage_url=url, start=False)
    agent.program = [sys.executable, "-m", "app"]  # this checkout's app (cwd), not the console script's install
    agent.start()
    # It answers once its socket listens, which can be a moment before that line is written.
    deadline = time.monotonic() + 30
    while not (lines := [line for line in agent.log_text().splitlines() if "board agent: serving" in line]):
        assert time.monotonic() < deadline, agent.log_text()
        time.sleep(0.05)
    [line] = lines
    if url:
        from app.store.pg import where

        assert f" on PostgreSQL {where(url)} as uid " in line and str(agent.db) not in line, line
        assert ".db" not in line, line
    else:
        assert f" on {agent.db} as uid " in line, line


# -- its log ----------------------------------------------------------------------------------------


def test_the_agents_log_has_journald_priorities_under_systemd_and_the_time_and_level_elsewhere(make_agent):
    """The real agent, its database's directory left group-readable (0750: a warning as it makes it 0700). With its
    stderr the stream JOURNAL_STREAM names, as systemd runs the unit: every line starts with its syslog priority and
    has no time; the warning is <4>, its start and stop lines <6>. Run again with stderr a plain file and
    BOARD_LOG_LEVEL=warning: the warning alone, after the time and its level's name.
    Wrong versions: print to stderr kept (no priority, no level); every line one priority; the time written for
    journald too; BOARD_LOG_LEVEL ignored (the start and stop lines written at warning)."""
    agent = make_agent(start=False)
    agent.program = [sys.executable, "-m", "app"]  # this checkout's app (cwd), not the console script's install
    agent.log.touch()
    stream = os.stat(agent.log)
    agent.env = {"JOURNAL_STREAM": f"{stream.st_dev}:{stream.st_ino}"}
    loosened = f"board agent: {agent.db.parent}: mode 750 -> 700"
    os.chmod(agent.db.parent, 0o750)
    agent.start()
    assert agent.stop() == 0
    under_systemd = agent.log.read_text()
    lines = under_systemd.splitlines()
    assert lines[0] == f"<4>{loosened}" and lines[-1] == "<6>board agent: stopped", under_systemd
    assert [line for line in lines if line.startswith("<6>board agent: serving ")], under_systemd
    assert all(re.match(r"<[2-7]>", line) for line in lines) and not re.search(r"\d\d:\d\d:\d\d", under_systemd)

    agent.env = {"BOARD_LOG_LEVEL": "warning"}
    os.chmod(agent.db.parent, 0o750)
    agent.start()
    assert agent.stop() == 0
    elsewhere = agent.log.read_text()[len(under_systemd):]
    assert re.fullmatch(rf"\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d WARNING {re.escape(loosened)}\n", elsewhere), elsewhere

