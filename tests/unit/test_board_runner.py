"""`board runner`'s connection to the service (app.cli.runner.cmd_runner): while the service is away it tries again
each RECONNECT_S and says so once, not each time; a lost service is registered with again; a refusal ends it with
the service's reason and is never tried again. The service's side is a Unix socket the test answers on; the runner is
the real loop. As board-llama against the real service: tests/llama/test_servers_service.py::TestPlannedServers."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from app.cli import runner
from app.errors import NotPermitted
from tests.agent_process import ENVIRON, REPO


class Service:
    """The service's socket, there or not: `answer` listens at `path` and answers the next registration once, then
    goes away (closes the line and the socket file), as a restart does."""

    def __init__(self, path: str) -> None:
        self.path, self.asked = path, []
        self.listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listening.bind(path)
        self.listening.listen(1)
        self.thread: threading.Thread | None = None

    def answer(self, reply: dict) -> None:
        def serve() -> None:
            conn, _ = self.listening.accept()
            with conn, conn.makefile("rb") as reader:
                self.asked.append(json.loads(reader.readline()))
                conn.sendall(json.dumps({"v": 1, "id": 1, **reply}).encode() + b"\n")
            self.listening.close()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()


def test_the_runner_says_once_that_the_service_is_away_registers_again_and_stops_at_a_refusal(tmp_path, monkeypatch,
                                                                                              daemon_log):
    """Away for three tries, then registered; lost (a restart), away for two tries, then refused: one 'can't reach'
    line for each time away, one 'lost' line, and the refusal raised with the service's reason, never tried again.
    Wrong versions: a refusal tried again like an absent service (a runner refused for good retries each second,
    forever); 'can't reach' said at every try; not said again after the service came back and went away."""
    path = str(tmp_path / "agent.sock")
    tries: list[int] = []
    services: list[Service] = []

    def register(where):
        tries.append(len(tries) + 1)
        if len(tries) > 7:
            raise AssertionError("the runner tried again after the service refused it")
        if len(tries) in (4, 7):  # the service is there for the 4th try (accepts) and the 7th (refuses)
            services.append(Service(path))
            services[-1].answer({"ok": True, "result": {"runner": 1}} if len(tries) == 4 else
                                {"ok": False, "error": {"code": 4, "message": "a runner is registered already"}})
        try:
            return real(where)
        finally:
            if services:
                services[-1].thread.join(10)
                if len(tries) == 4:
                    (tmp_path / "agent.sock").unlink()

    real = runner._register
    monkeypatch.setattr(runner, "_register", register)
    monkeypatch.setattr(runner, "RECONNECT_S", 0)
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # cmd_runner's SIGTERM handler: not the test process's
    ctx = SimpleNamespace(config=SimpleNamespace(service=SimpleNamespace(socket=path)),
                          environ={"XDG_STATE_HOME": str(tmp_path / "state")})
    with pytest.raises(NotPermitted) as refused:
        runner.cmd_runner(ctx)
    assert str(refused.value) == "the service refused the runner: a runner is registered already"
    assert tries == [1, 2, 3, 4, 5, 6, 7]
    assert [s.asked for s in services] == [[{"v": 1, "id": 1, "op": "register", "args": {"kind": "runner"}}]] * 2
    said = daemon_log().splitlines()
    away = f"board runner: can't reach the service at {path} (No such file or directory); trying again every second"
    assert said[1:] == [away, "board runner: registered with the service",
                        "board runner: lost the service; registering again (the servers keep running)", away]


def test_the_real_runner_logs_with_journald_priorities_on_the_journals_stream(tmp_path):
    """`board runner` as its unit runs it, its stderr the stream JOURNAL_STREAM names, the service away: its first
    line <6> (info), then the 'can't reach' warning <4>, neither with a time; SIGTERM ends it (0).
    Wrong versions: the runner's lines still printed (no priority); every line one priority; the time written."""
    config, log = tmp_path / "board.toml", tmp_path / "runner.log"
    path = tmp_path / "agent.sock"
    config.write_text(f'[service]\nsocket = "{path}"\n')
    log.touch()
    stream = os.stat(log)
    environ = {**ENVIRON, "BOARD_CONFIG": str(config), "XDG_STATE_HOME": str(tmp_path / "state"),
               "JOURNAL_STREAM": f"{stream.st_dev}:{stream.st_ino}"}
    with log.open("ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "app", "runner"], stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, env=environ, cwd=REPO)
    try:
        deadline = time.monotonic() + 30  # bounded: it says so before its first second's wait
        while "can't reach" not in log.read_text() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGTERM)
        rc = process.wait(10)
    lines = log.read_text().splitlines()
    assert rc == 0 and lines == [
        f"<6>board runner: uid {os.getuid()}, service {path}",
        f"<4>board runner: can't reach the service at {path} (No such file or directory); trying again every second"
    ], lines

