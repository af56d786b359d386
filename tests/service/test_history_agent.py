"""The real `board agent` keeps the history: it samples at start and every [history] sample_s, into its own file."""

from __future__ import annotations

import os
import pwd
import sqlite3
import stat
import time

from tests.agent_process import SERVICE_USER


def _rows(path) -> list[tuple]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT ts, card, state, vram, power FROM sample_view ORDER BY id").fetchall()
    finally:
        conn.close()


def _ready(path) -> bool:
    """The first round is in: the file exists before its tables do, so 'no such table' is 'not yet'."""
    try:
        return path.exists() and len(_rows(path)) >= 8
    except sqlite3.OperationalError as error:
        if "no such table" not in str(error):
            raise
        return False


def test_the_agent_samples_every_card_into_its_own_file_and_the_op_reads_it(agent):
    history = agent.db.with_name("board.history.db")
    deadline = time.monotonic() + 30
    while not _ready(history):  # its first round, at start
        assert time.monotonic() < deadline, f"no history after 30 s:\n{agent.log_text()}"
        time.sleep(0.2)
    info = os.stat(history)
    assert info.st_uid == pwd.getpwnam(SERVICE_USER).pw_uid and stat.S_IMODE(info.st_mode) == 0o600  # the service's only
    first = _rows(history)[:8]
    assert sorted(row[1] for row in first) == list(range(1, 9)) and len({row[0] for row in first}) == 1
    client = agent.client()
    try:
        found = client.call("history", seconds=600, step=10)
    finally:
        client.close()
    assert len(found) == 8
    stored = {round(row[3] / 1024, 6) for row in _rows(history)}
    for points in found.values():  # what the store holds, not a replay: one point a sample so far
        assert len(points) <= len(_rows(history)) // 8 + 1
        assert all(round(p[1], 6) in stored and len(p) == 5 for p in points)
