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


def test_the_agent_samples_every_card_into_its_own_file_and_the_op_reads_it(agent):
    history = agent.db.with_name("board.history.db")
    deadline = time.monotonic() + 30
    while not (history.exists() and len(_rows(history)) >= 8):  # its first round, at start
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
