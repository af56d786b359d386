"""Helpers for the service tests: the real agent run as the unit runs it, users, and the CLI."""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import agent_process, unix_users

REPO = Path(__file__).resolve().parents[2]
BOARD = Path(sys.prefix) / "bin" / "board"  # the venv's console script, as the unit's ExecStart names it
SERVICE_USER = agent_process.SERVICE_USER
TOOLS = ("setpriv", "useradd", "groupadd")


def root_reason() -> str | None:
    """Why the tests that run the real service can't run here, or None."""
    if os.geteuid() != 0:
        return "the service tests need root: they create the system user board and run the agent as it (CI runs as root)"
    if missing := [t for t in TOOLS if shutil.which(t) is None]:
        return f"the service tests need {', '.join(missing)} (apt-get install passwd util-linux)"
    if not BOARD.exists():
        return f"no {BOARD}: install the project into the venv (pip install -e .)"
    return None


def needs_root():
    """Skip (with the reason) where the real service can't be started, and mark the test `users`."""
    reason = root_reason()
    if reason:
        pytest.skip(reason)


def ensure_system_user() -> pwd.struct_passwd:
    """The system group and user `board`, as scripts/install_shared.sh creates them (idempotent)."""
    unix_users.ensure_service_user(group=SERVICE_USER)
    return pwd.getpwnam(SERVICE_USER)


def ensure_outsider(name: str = "mallory") -> pwd.struct_passwd:
    """A plain user in no board group at all (tests/users uses the same name for its outsider)."""
    unix_users.ensure_user(name)
    entry = pwd.getpwnam(name)
    board_gid = grp.getgrnam(SERVICE_USER).gr_gid
    if name in grp.getgrnam(SERVICE_USER).gr_mem or entry.pw_gid == board_gid:
        raise RuntimeError(f"{name} is in group {SERVICE_USER}; the outsider tests need a non-member")
    return entry


def run_as(user: str, *cmd: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(unix_users.as_user(user, list(cmd)), capture_output=True, text=True, env=env, cwd="/",
                          timeout=timeout)


_reachable: dict[str, str | None] = {}


def check_reachable(user: str) -> None:
    """`user` can run this venv's python on this checkout (opening the way, o+x, first); else skip."""
    if user not in _reachable:
        unix_users.open_checkout_for_others()
        _reachable[user] = unix_users.cannot_run_checkout(user)
    if _reachable[user] is not None:
        pytest.skip(_reachable[user])


# -- the agent ---------------------------------------------------------------------------------


@dataclass
class Agent:
    """One real service: its scratch directory, config, database and socket, and the running process."""

    root: Path
    settings: dict = field(default_factory=dict)  # extra [service] keys
    display: dict = field(default_factory=dict)  # extra [display] keys
    sections: dict = field(default_factory=dict)  # further sections: {"fleet": {"host": "gpu2"}, "history": {...}}
    shared_db: Path | None = None  # another agent's database (hosts of one fleet), instead of its own
    proc: subprocess.Popen | None = None
    starts: int = 0
    program: list[str] | None = None  # how to run board: this venv's console script unless given
    storage_url: str | None = None  # [storage] url: a PostgreSQL store (tests/postgres.py), else the SQLite file

    @property
    def config(self) -> Path:
        return self.root / "board.toml"

    @property
    def db(self) -> Path:
        return self.shared_db or self.root / "lib" / "board.db"

    @property
    def socket(self) -> Path:
        return self.root / "run" / "board.sock"

    @property
    def log(self) -> Path:
        return self.root / "agent.log"

    def write_config(self) -> None:
        entry = pwd.getpwnam(SERVICE_USER)
        for name, mode in (("lib", 0o700), ("run", 0o755)):
            directory = self.root / name
            directory.mkdir(exist_ok=True)
            os.chown(directory, entry.pw_uid, entry.pw_gid)
            os.chmod(directory, mode)
        service = {"socket": str(self.socket), "group": SERVICE_USER, **self.settings}
        lines = ["[storage]", f'db = "{self.db}"', *([f'url = "{self.storage_url}"'] if self.storage_url else []),
                 "", "[service]"]
        lines += [f"{key} = {_toml(value)}" for key, value in service.items()]
        if self.display:
            lines += ["", "[display]", *(f"{key} = {_toml(value)}" for key, value in self.display.items())]
        for section, table in self.sections.items():
            lines += ["", f"[{section}]", *(f"{key} = {_toml(value)}" for key, value in table.items())]
        self.config.write_text("\n".join(lines) + "\n")
        os.chmod(self.config, 0o644)

    def start(self, timeout: float = 30.0) -> None:
        """Start it and wait until it answers on its socket."""
        self.spawn()
        agent_process.wait_serving(self.proc, self.socket, self.log, timeout)

    def spawn(self) -> None:
        """`board agent` as the unit runs it (tests/agent_process.py), without waiting."""
        assert self.proc is None or self.proc.poll() is not None, "the agent is already running"
        self.starts += 1
        self.proc = agent_process.start(self.program or [str(BOARD)], self.config, self.log, getattr(self, "env", None))

    def answers(self) -> bool:
        return agent_process.answers(self.socket)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, as systemctl stop does; returns the exit status (SIGKILL and a failure if it does not end)."""
        if self.proc is None:
            return 0
        rc = agent_process.stop(self.proc, timeout)
        if rc is None:
            raise AssertionError(f"board agent ignored SIGTERM for {timeout:g} s:\n{self.log_text()}")
        return rc

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def log_text(self) -> str:
        return agent_process.tail(self.log)

    def client(self, timeout: float = 30.0):
        from app.client.socket import SocketClient

        return SocketClient(str(self.socket), timeout=timeout)


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def board_cli(*args: str, env: dict, timeout: float = 60) -> tuple[int, str, str]:
    """The real `board` with exactly this environment (plus PATH and TZ)."""
    full = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TZ": "UTC", **env}
    result = subprocess.run([str(BOARD), *args], capture_output=True, text=True, env=full, cwd=REPO, timeout=timeout)
    return result.returncode, result.stdout, result.stderr


class Raw:
    """A bare connection to the socket, speaking the wire by hand: for the protocol's bad cases."""

    def __init__(self, path, timeout: float = 10.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self._buffer = b""
        self._id = 0

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, op, args=None, v=1, **extra) -> dict:
        self._id += 1
        message = {"v": v, "id": self._id, "op": op, **({} if args is None else {"args": args}), **extra}
        self.send(json.dumps(message).encode() + b"\n")
        return self.reply()

    def line(self) -> bytes:
        """One line, or b"" at end of stream."""
        while b"\n" not in self._buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                rest, self._buffer = self._buffer, b""
                return rest
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line + b"\n"

    def reply(self) -> dict:
        line = self.line()
        assert line.endswith(b"\n"), f"the service closed the connection instead of answering ({line[:200]!r})"
        return json.loads(line)

    def closed(self, timeout: float = 10.0) -> bool:
        """True once the service closed its end (EOF), with nothing more said."""
        self.sock.settimeout(timeout)
        try:
            return self.line() == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()
