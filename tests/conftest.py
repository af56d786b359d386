"""Shared fixtures: a real database per test (a SQLite file, and with the `postgresql` tier a fresh PostgreSQL database
on a throwaway cluster: tests/postgres.py), the simulated fleet, and a booking service bound to them."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from app.config import Config, PostgresStore
from app.service.rules.bookings import BookingService
from app.core.identity import Identity
from app.gpu import open_source
from app.store.db import connect

REPO = Path(__file__).resolve().parent.parent
# A fixed instant: Sunday 2026-11-29 15:30 UTC.
FROZEN_NOW = 1795966200


# The slow tiers (pyproject.toml's markers), given here by what a test needs rather than in each file. A fixture
# marks every test that uses it (directly or through another fixture); a path marks everything under it. Tests that
# reach a tier another way (a fixture's param, a helper called in the test) carry the marker themselves.
TIER_FIXTURES = {
    "unix_users": "real_users",  # tests/unix_users.py: alice, bob, carol, mallory and the service user board
    "make_agent": "real_users",  # the agent as the unit runs it, as user board
    "llama_server": "llama_server",  # the real binary (scripts/build_llama_server.sh)
    "llama_server_bin": "llama_server",
    "prometheus_bin": "prometheus",  # a real Prometheus and promtool (scripts/fetch_prometheus.sh)
    "pg_cluster": "postgresql",  # a throwaway PostgreSQL cluster (tests/postgres.py); `store`'s second param
}
TIER_PATHS = {
    "tests/users": "real_users",
    "tests/integration/test_history_budget.py": "slow",  # a synthetic year of history, about 2 minutes
    "tests/integration/test_packaging.py": "slow",  # builds the wheel and installs it in a fresh venv
    "tests/integration/test_pipx_install.py": "slow",  # pipx from PyPI, and `pipx install` of the checkout
}
# Not safe beside other tests: each must answer within a deadline its issue sets, which a busy machine can miss.
# `make test` runs them after the parallel pass, one at a time. A path, or a node id and what it holds.
SERIAL = {
    "tests/users/test_floods.py",  # alice's whoami within 5 s while 3,000 connections flood the agent
    "tests/integration/test_gateway_flood.py",  # a member's completion within 2 s while 2,000 flood the gateway
    "tests/llama/test_gateway.py::test_a_server_whose_llama_server_died_leaves_the_routing_within_5_s",  # within 5 s
    "tests/users/test_jobs.py::test_a_job_outliving_its_booking_gets_sigterm_and_knows_its_end",  # SIGTERM within 4 s
    "tests/users/test_sharing.py::test_alice_and_bob_both_book_and_each_sees_the_other_at_once",  # seen within 5 s
    "tests/llama/test_servers.py::TestWaiting::test_the_waiting_cli_notices_a_supervisor_that_died_and_does_not_wait_"
    "for_the_timeout",  # the waiting CLI gives up within 5 s
    "tests/tui/test_hangup.py",  # the board gone within 2 s of its terminal closing
    "tests/tui/test_tui_behaviour.py::TestLive",  # the live board's updates and keys within 2 s
}
# Modules whose module-scoped fixture costs a minute or more (an install in a fresh venv): on one worker, made once.
ONE_WORKER_PATHS = {
    "tests/users/test_install.py",
    "tests/integration/test_packaging.py",
}


@pytest.hookimpl(tryfirst=True)  # before the folders' hooks, which skip by these markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(item.fspath).resolve().relative_to(REPO).as_posix()
        fixtures = set(getattr(item, "fixturenames", ()))
        marks = {tier for fixture, tier in TIER_FIXTURES.items() if fixture in fixtures}
        marks |= {tier for where, tier in TIER_PATHS.items() if path == where or path.startswith(where + "/")}
        if any(path == where or item.nodeid == where or item.nodeid.startswith(where + "::") for where in SERIAL):
            marks.add("serial")
        for mark in sorted(marks):
            item.add_marker(mark)
        if path in ONE_WORKER_PATHS:
            item.add_marker(pytest.mark.xdist_group(path))  # with pytest-xdist's --dist loadgroup


@pytest.fixture(scope="session")
def prometheus_bin() -> Path:
    """The folder with prometheus and promtool: BOARD_PROMETHEUS_DIR, the PATH, or the cached download."""
    import subprocess

    if folder := os.environ.get("BOARD_PROMETHEUS_DIR"):
        return Path(folder)
    if (found := shutil.which("promtool")) and shutil.which("prometheus"):
        return Path(found).parent
    fetched = subprocess.run([str(REPO / "scripts" / "fetch_prometheus.sh")], capture_output=True, text=True, timeout=300)
    if fetched.returncode != 0:
        pytest.skip(f"no prometheus/promtool: scripts/fetch_prometheus.sh failed: {fetched.stderr.strip()[-300:]}")
    return Path(fetched.stdout.strip())


@pytest.fixture(scope="session", autouse=True)
def _no_temp_left_by_mutmut(tmp_path_factory):
    """mutmut runs each mutant as a pytest session in a child that ends without atexit, so pytest never unlocks and
    prunes that session's temporary folder (gigabytes an hour): under mutmut, the session removes its own."""
    under_mutmut = "MUTANT_UNDER_TEST" in os.environ
    yield
    if under_mutmut:
        shutil.rmtree(tmp_path_factory.getbasetemp(), ignore_errors=True)


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    """No test sees the machine's board config, database or simulation switch unless it sets them."""
    for name in ("BOARD_DB", "BOARD_CONFIG", "BOARD_SIMULATE", "BOARD_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


@pytest.fixture
def db_path(tmp_path) -> Path:
    return tmp_path / "board.db"


# The stores every store-level and behaviour test runs on. PostgreSQL's param is its own tier (`postgresql`): make
# test runs it, make check does not. A test about SQLite itself takes `sqlite_only`.
STORES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgresql)]
sqlite_only = pytest.mark.parametrize("store", ["sqlite"], indirect=True)
postgresql_only = pytest.mark.parametrize("store", STORES[1:], indirect=True)


@pytest.fixture(scope="session")
def pg_cluster():
    """One throwaway PostgreSQL cluster per worker (tests/postgres.py); skipped with the reason where none can run."""
    from tests.postgres import Cluster, missing_reason

    if reason := missing_reason():
        pytest.skip(reason)
    cluster = Cluster()
    yield cluster
    cluster.stop()


@pytest.fixture(params=STORES)
def store(request, db_path):
    """Where the test's board keeps its data: the SQLite file db_path, or a fresh PostgreSQL database (Config.store)."""
    if request.param == "sqlite":
        yield db_path
        return
    cluster = request.getfixturevalue("pg_cluster")
    url = cluster.fresh_database()
    yield PostgresStore(url, host="test")
    cluster.drop(url)


@pytest.fixture
def conn(store):
    connection = connect(store)
    yield connection
    connection.close()


@pytest.fixture
def fleet():
    """The default simulated fleet, read at FROZEN_NOW."""
    return open_source(True, clock=lambda: FROZEN_NOW).read()


@pytest.fixture
def make_service(conn, fleet):
    """make_service(name="alice", uid=1001, admin=False, config=Config(), now=FROZEN_NOW)."""

    def make(name="alice", uid=1001, admin=False, config=None, now=FROZEN_NOW):
        clock = now if callable(now) else (lambda: now)
        return BookingService(conn, Identity(name, uid, admin), config or Config(), fleet.cards, fleet.topology, clock)

    return make


def worded(said) -> str:
    """A service's message (an error, a note, a notice) as a member's client shows it: its time stamps worded in
    this process's zone, as both clients do at their door (app.client.stamps.worded)."""
    from app.core.text import localize

    return localize(str(said))


class Clock:
    """A clock the test moves by hand: `clock.now += 60`."""

    def __init__(self, now: float = FROZEN_NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def run_board(*args: str, env: dict | None = None, input: str | None = None, user_env: bool = True):
    """Run the real `board` CLI in a subprocess; returns CompletedProcess (text)."""
    import subprocess

    full_env = {k: v for k, v in os.environ.items() if not k.startswith("BOARD_")} if user_env else {}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, env=full_env, input=input,
        cwd=REPO, timeout=60,
    )


def day(n: int) -> str:
    """The date n days from today (UTC), as the CLI reads it."""
    return (datetime.now(timezone.utc).date() + timedelta(days=n)).isoformat()


def one_line(result) -> str:
    """The one line a refusal writes on stderr (starting 'board'), never a traceback."""
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("board"), result.stderr
    return lines[0]


@pytest.fixture
def set_tz():
    """Set the process TZ (time.tzset) for one test, restored afterwards."""
    old = os.environ.get("TZ")

    def _set(name):
        os.environ["TZ"] = name
        time.tzset()

    yield _set
    if old is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = old
    time.tzset()


@pytest.fixture
def daemon_log(caplog):
    """What the board's modules (the loggers under `app`) logged in this process, from INFO up, one message a line:
    each call returns the lines since the last, as capsys.readouterr does (the daemons log through `logging`,
    app.cli.logs); a library's lines (aiohttp's access log of a test's upstream) are not the board's. A daemon
    started here (app.cli.logs.start_logging) leaves the root logger as it found it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    caplog.set_level(logging.INFO)
    read = [0]

    def since() -> str:
        records = caplog.records[read[0]:]
        read[0] += len(records)
        return "".join(f"{record.getMessage()}\n" for record in records if record.name.startswith("app."))

    yield since
    for handler in set(root.handlers) - set(handlers):
        root.removeHandler(handler)
    root.setLevel(level)
