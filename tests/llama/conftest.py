"""Fixtures for the llama-server tests: the real binary, a tiny GGUF, and a board on a fresh database.

The tests run the real CLI in subprocesses, as users would. pytest makes itself a child subreaper, so
the detached supervisors (whose parent, the CLI, exits at once) are re-parented to it instead of to
PID 1; `gone(server)` reaps them and then checks with os.killpg(pgid, 0) that the whole process
group is gone. Without that, a PID 1 that does not reap would leave zombies in the group forever.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import sqlite3
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import run_board
from tests.llama.tiny_gguf import write_tiny_gguf
from tests.ports import port_range

PR_SET_CHILD_SUBREAPER = 36


def _find_llama_server() -> str | None:
    value = os.environ.get("BOARD_LLAMA_SERVER")
    if value and os.path.isfile(value) and os.access(value, os.X_OK):
        return value
    return shutil.which("llama-server")


# Read at import, before the autouse fixture clears BOARD_* variables for each test.
LLAMA_SERVER = _find_llama_server()
NO_LLAMA_REASON = "no llama-server binary: run 'make llama-server' and set BOARD_LLAMA_SERVER (make test does both)"


def pytest_collection_modifyitems(config, items):
    if LLAMA_SERVER:
        return
    if os.environ.get("BOARD_LLAMA_SERVER"):  # make test names a binary: a missing one is a failure, not a skip
        raise pytest.UsageError(f"BOARD_LLAMA_SERVER={os.environ['BOARD_LLAMA_SERVER']!r} is not an executable file")
    skip = pytest.mark.skip(reason=NO_LLAMA_REASON)
    for item in items:
        if item.get_closest_marker("llama_server") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def _subreaper():
    """For the modules that start supervisors (their `pytestmark`); not the pure tests, which mutmut runs
    in its own process, where a subreaper would reap orphans that are not its workers."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
    except (OSError, AttributeError):
        pass
    yield


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf")


@pytest.fixture(scope="session")
def llama_server() -> str:
    if not LLAMA_SERVER:
        pytest.skip(NO_LLAMA_REASON)
    return LLAMA_SERVER


def gone(server: dict, timeout: float = 20) -> bool:
    """True once no process of the server's group is left: reap what was re-parented to us (this process is a
    subreaper), then os.killpg(pgid, 0) must say there is no such group."""
    deadline = time.monotonic() + timeout
    while True:
        for pid in (server["supervisor_pid"], server["pid"]):
            if pid:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:  # not ours (a service's supervisor), or reaped already
                    pass
        try:
            os.killpg(server["pgid"], 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


class Board:
    """The real `board` CLI on one fresh database and the simulated fleet, with helpers for servers."""

    def __init__(self, tmp_path: Path, server_bin: str | None, ready_timeout_s: float = 60.0):
        self.tmp_path = tmp_path
        self.db = tmp_path / "board.db"
        self.port_min, self.port_max = port_range("llama", 40)  # of our own: other workers and runs share this host
        self.config = tmp_path / "board.toml"
        self.config.write_text(textwrap.dedent(f"""\
            [llama]
            port_min = {self.port_min}
            port_max = {self.port_max}
            ready_timeout_s = {ready_timeout_s}
        """))
        self.env = {"BOARD_DB": str(self.db), "BOARD_SIMULATE": "1", "BOARD_CONFIG": str(self.config),
                    "XDG_STATE_HOME": str(tmp_path / "state")}
        if server_bin:
            self.env["BOARD_LLAMA_SERVER"] = server_bin

    def run(self, *args: str, env: dict | None = None, timeout: float = 60):
        return run_board(*args, env={**self.env, **(env or {})})

    def ok(self, *args: str, env: dict | None = None):
        result = self.run(*args, env=env)
        assert result.returncode == 0, f"board {' '.join(args)} -> {result.returncode}\n{result.stderr}"
        return result

    def json(self, *args: str):
        return json.loads(self.ok(*args, "--json").stdout)

    def book(self, cards: str = "0", *extra: str) -> int:
        return self.json("book", "--cards", cards, "--for", "1h", *extra)["id"]

    def start(self, booking: int, model: Path, *extra: str, env: dict | None = None) -> dict:
        result = self.ok("serve", "start", str(booking), "--model", str(model), "--ctx", "256", *extra, "--json",
                         env=env)
        return json.loads(result.stdout)

    def servers(self) -> list[dict]:
        return self.json("serve", "list", "--all")["servers"]

    def server(self, server_id: int) -> dict:
        return next(s for s in self.servers() if s["id"] == server_id)

    def wait_state(self, server_id: int, states: tuple[str, ...], timeout: float = 20) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            server = self.server(server_id)
            if server["state"] in states or time.monotonic() > deadline:
                return server
            time.sleep(0.1)

    def raw(self) -> sqlite3.Connection:
        return sqlite3.connect(self.db)

    gone = staticmethod(gone)  # board.gone(server), as the tests read it

    def cleanup(self) -> None:
        """Kill whatever a failed test left running, by the recorded process groups (and only those)."""
        if not self.db.exists():
            return
        with self.raw() as conn:
            try:
                rows = conn.execute("SELECT pgid, pid, supervisor_pid FROM servers WHERE pgid IS NOT NULL").fetchall()
            except sqlite3.OperationalError:
                return
        from app.llama.identity import group_members

        for pgid, pid, supervisor_pid in rows:
            if group_members(pgid):
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            for child in (supervisor_pid, pid):
                if child:
                    try:
                        os.waitpid(child, os.WNOHANG)
                    except ChildProcessError:
                        pass


@pytest.fixture
def board(tmp_path, llama_server):
    b = Board(tmp_path, llama_server)
    yield b
    b.cleanup()


@pytest.fixture
def fake_board(tmp_path):
    """A board whose llama-server is a script (`fake_server`); for rules that need no real model."""
    b = Board(tmp_path, None, ready_timeout_s=30)
    yield b
    b.cleanup()


FAKE_SERVER = """\
#!{python}
# Stands in for llama-server: listens on --port, answers /health with {status}, {term}.
import http.server, signal, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
{handler}
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response({status}); self.end_headers(); self.wfile.write(b"{{}}")
    def log_message(self, *args):
        pass
print("fake llama-server on", port, flush=True)
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def make_fake_server(directory: Path, *, status: int = 503, ignore_term: bool = False) -> Path:
    path = directory / ("fake-llama-server-" + ("stubborn" if ignore_term else str(status)))
    handler = "signal.signal(signal.SIGTERM, signal.SIG_IGN)" if ignore_term else ""
    path.write_text(FAKE_SERVER.format(python=sys.executable, status=status, handler=handler,
                                       term="ignores SIGTERM" if ignore_term else "exits on SIGTERM"))
    path.chmod(0o755)
    return path
