"""A session that holds the board's write lock for as long as it likes (a compromised host's role, issue 31 §7): the
real agent on PostgreSQL beats its heartbeat and enforces its jobs on, and a change over its socket fails once its own
lock timeout passes (its session's: the holder cannot lift it), in one line naming the role, application and pid that
hold the lock; once the holder lets go, changes go through again."""

from __future__ import annotations

import os
import queue
import re
import sys
import threading
import time

import psycopg
import pytest

from app.store.pg import WRITE_LOCK
from tests.service.support import board_cli
from tests.service.test_db_unreachable import HOUR, _env, _run_job, _wait_until


@pytest.fixture
def gpu1(make_agent, pg_cluster):
    """An agent as host gpu1 on a fresh PostgreSQL database, enforcing twice a second; `python -m app` from this
    checkout (the venv's console script imports the package it was installed from)."""
    agent = make_agent(storage_url=pg_cluster.fresh_database(), start=False,
                       sections={"fleet": {"host": "gpu1"}, "enforce": {"interval_s": 0.5, "grace_s": 30}})
    agent.program = [sys.executable, "-m", "app"]
    agent.start()
    return agent


def test_a_held_write_lock_stops_no_heartbeat_nor_enforcement_and_a_change_names_its_holder(gpu1):
    member = gpu1.client()
    notices: queue.Queue = queue.Queue()
    listener = gpu1.client()
    threading.Thread(target=lambda: [notices.put(e) for e in listener.subscribe(("notice",))], daemon=True).start()
    now = int(time.time())
    staying = member.call("book", cards=[1], start=now, end=now + 9 * 60)
    ending = member.call("book", cards=[2], start=now, end=now + 15)
    # queued behind `staying`: each enforcement pass moves the queue up first (backfill), which writes
    member.call("book", cards=[1], start=now, end=now + HOUR, or_later=True)
    jobs = {b["id"]: _run_job(gpu1, b["id"]) for b in (staying, ending)}
    mallory = psycopg.connect(gpu1.storage_url, autocommit=True, application_name="board gpu2")
    try:
        told = set()
        while len(told) < 2:  # "booking N ends in M min; your job (pid P) will be stopped then": both jobs are known
            message = notices.get(timeout=30)["message"]
            told |= {b for b in jobs if message.startswith(f"booking {b} ends in")}
        # a session lock: no statement or transaction timeout of the holder's own ends it
        mallory.execute("SET statement_timeout = 0; SET idle_session_timeout = 0")
        mallory.execute("SELECT pg_advisory_lock(%s)", (WRITE_LOCK,))
        pid = mallory.info.backend_pid
        beaten = mallory.execute("SELECT seen_at FROM hosts WHERE host = 'gpu1'").fetchone()[0]

        # the heartbeat goes on: the other hosts do not see gpu1 go HOST DOWN
        _wait_until(lambda: mallory.execute("SELECT seen_at FROM hosts WHERE host = 'gpu1'").fetchone()[0]
                    > beaten + 2, 30, "the heartbeat stopped")
        # enforcement: the ended booking's job is stopped, the live one's runs on; the audit waits for the lock
        assert jobs[ending["id"]].wait(timeout=90) == -15, jobs[ending["id"]].stderr.read()
        assert jobs[staying["id"]].poll() is None
        holder = f"role postgres (board gpu2, pid {pid}) holds the lock it needs"
        _wait_until(lambda: re.search(rf"job-stop of booking {ending['id']} not audited: the board database stayed"
                                      rf" locked for \d+ s: {re.escape(holder)}", gpu1.log_text()), 60,
                    "the stop was not said in the log")
        # a change: refused in one line naming the holder, exit 1, nothing changed
        rc, out, err = board_cli("cancel", str(staying["id"]), env=_env(gpu1), timeout=60)
        assert (rc, out) == (1, "") and re.fullmatch(
            rf"board: the board database stayed locked for \d+ s: {re.escape(holder)}; nothing was changed: try"
            rf" again; a superuser may end that session: SELECT pg_terminate_backend\({pid}\)\n", err), err
        assert member.call("list")["bookings"][0]["status"] == "booked"
    finally:
        mallory.close()
        for job in jobs.values():
            if job.poll() is None:
                os.killpg(job.pid, 9)
            job.wait(timeout=10)
    # the holder gone, the member's change goes through
    member.call("cancel", id=staying["id"])
    assert "Traceback" not in gpu1.log_text()
    member.close()
    listener.close()
