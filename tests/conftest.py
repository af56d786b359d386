"""Shared fixtures: a real SQLite file per test, the simulated fleet, and a booking service bound to them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from app.config import Config
from app.service.bookings import BookingService
from app.core.identity import Identity
from app.gpu import open_source
from app.store.db import connect

REPO = Path(__file__).resolve().parent.parent
# A fixed instant: Sunday 2026-11-29 15:30 UTC.
FROZEN_NOW = 1795966200


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    """No test sees the machine's board config, database or simulation switch unless it sets them."""
    for name in ("BOARD_DB", "BOARD_CONFIG", "BOARD_SIMULATE", "BOARD_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


@pytest.fixture
def db_path(tmp_path) -> Path:
    return tmp_path / "board.db"


@pytest.fixture
def conn(db_path):
    connection = connect(db_path)
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
