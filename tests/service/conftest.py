"""The board service as the unit runs it, and the same tests over both transports.

- `agent`: the real `board agent`, started exactly as the systemd unit does but without systemd:
  `setpriv --reuid board --regid board --init-groups --inh-caps +kill --ambient-caps +kill board agent`,
  with BOARD_CONFIG naming a config with `[storage] db` (in a 0700 directory owned by board) and
  `[service] socket`/`group`, and BOARD_SIMULATE=1. Needs root (it creates the system user board);
  without root those tests are skipped with the reason.
- `client`: the same behaviour over both transports: "local" (the service in this process, on a
  database file in tmp_path, the simulated fleet) and "socket" (a SocketClient to the agent, as
  root: root is admin and member); and on both stores (`store`: SQLite, or a fresh database on the
  throwaway PostgreSQL cluster, tests/postgres.py, which the agent reaches by its socket).
- `cli`: the real `board` command for the same transport, as (rc, stdout, stderr).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.service.support import BOARD, REPO, SERVICE_USER, Agent, check_reachable, ensure_system_user, needs_root
from tests.shared_install import scratch_dir


@pytest.fixture
def make_agent():
    """make_agent(service={...}, display={...}, start=True, sections={...}, shared_db=None): a fresh agent in its own
    scratch directory under /tmp (on another agent's database with `shared_db`: one host of a fleet)."""
    needs_root()
    ensure_system_user()
    check_reachable(SERVICE_USER)
    agents: list[Agent] = []

    def make(service: dict | None = None, display: dict | None = None, start: bool = True,
             sections: dict | None = None, shared_db: Path | None = None, storage_url: str | None = None) -> Agent:
        # Not tmp_path: it lives under /root here, which user board cannot traverse.
        root = scratch_dir("board-service-")
        agent = Agent(root, dict(service or {}), dict(display or {}), sections=dict(sections or {}), shared_db=shared_db,
                      storage_url=storage_url)
        agent.write_config()
        agents.append(agent)
        if start:
            agent.start()
        return agent

    yield make
    problems = []
    for agent in agents:
        running = agent.proc is not None and agent.proc.poll() is None
        try:
            rc = agent.stop()
        except AssertionError as error:
            problems.append(str(error))
        else:
            if running and rc != 0:
                problems.append(f"board agent exited {rc} after SIGTERM:\n{agent.log_text()}")
        shutil.rmtree(agent.root, ignore_errors=True)
    assert not problems, "\n".join(problems)


@pytest.fixture
def agent(make_agent) -> Agent:
    """The real service with the default [service] settings, serving; stopped (and checked) at the end."""
    return make_agent()


# -- both transports ---------------------------------------------------------------------------


@dataclass
class Target:
    """Where `client` and `cli` point: the agent's socket, or a database file this process owns."""

    transport: str
    env: dict  # the CLI's environment
    agent: Agent | None = None
    db: Path | None = None
    config: Path | None = None
    url: str | None = None  # a PostgreSQL store's (tests/postgres.py), for both transports; None: SQLite


@pytest.fixture(params=["local", pytest.param("socket", marks=pytest.mark.real_users)])
def target(request, tmp_path, store) -> Target:
    base = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "TZ": "UTC",
        "HOME": str(tmp_path),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    url = getattr(store, "url", None)  # a PostgreSQL store's, else None: the SQLite file
    if request.param == "socket":
        agent = request.getfixturevalue("make_agent")(storage_url=url) if url else request.getfixturevalue("agent")
        return Target("socket", {**base, "BOARD_CONFIG": str(agent.config)}, agent=agent, url=url)
    config = tmp_path / "board.toml"
    db = tmp_path / "board.db"
    config.write_text(f'[storage]\ndb = "{db}"\n' + (f'url = "{url}"\n' if url else ""))
    return Target("local", {**base, "BOARD_CONFIG": str(config), "BOARD_DB": str(db), "BOARD_SIMULATE": "1"},
                  db=db, config=config, url=url)


@pytest.fixture
def client(target):
    """A LocalClient on a file in tmp_path with the simulated fleet, or a SocketClient to the agent (as root)."""
    if target.transport == "socket":
        made = target.agent.client()
    else:
        from app.client.local import LocalClient
        from app.config import load_config

        config = load_config(environ={"BOARD_CONFIG": str(target.config)})
        # BOARD_SIMULATE as the agent has it: the simulated fleet, and no demo bookings seeded.
        made = LocalClient.open(config, demo=None, environ={"BOARD_SIMULATE": "1"})
    assert made.transport == target.transport
    yield made
    made.close()


@pytest.fixture
def cli(target):
    """cli(*args, env=None) -> (rc, stdout, stderr): the real `board` for the same transport as `client`."""

    def run(*args: str, env: dict | None = None, timeout: float = 60) -> tuple[int, str, str]:
        result = subprocess.run([str(BOARD), *args], capture_output=True, text=True, env={**target.env, **(env or {})},
                                cwd=REPO, timeout=timeout)
        return result.returncode, result.stdout, result.stderr

    return run
