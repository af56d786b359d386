"""The PostgreSQL database unreachable (the throwaway cluster paused, tests/postgres.py): writes refuse in one line and
change nothing, reads of this host answer from the service's last state marked stale, enforcement continues from the
bookings it last knew, and once the database is back the service works again without a restart (issue 21, §2)."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import threading
import time
from contextlib import contextmanager
from datetime import datetime

import pytest

from app.client.local import LocalClient
from app.config import Config, FleetSettings, HistorySettings
from app.core.identity import Identity
from app.core.text import format_time
from app.gpu import open_source
from app.service.fleet.hosts import beat
from tests.service.support import BOARD, REPO, board_cli

HOUR = 3600
BACK_S = 90  # the service's connection retries with a backoff of at most 30 s (app.store.pg.BACKOFF_MAX_S)


@contextmanager
def paused(cluster):
    """The database away for the block; back after it, whatever the block did."""
    cluster.pause()
    try:
        yield
    finally:
        cluster.resume()


@pytest.fixture
def gpu1(make_agent, pg_cluster):
    """An agent as host gpu1 on a fresh PostgreSQL database, enforcing twice a second."""
    return make_agent(storage_url=pg_cluster.fresh_database(),
                      sections={"fleet": {"host": "gpu1"}, "enforce": {"interval_s": 0.5, "grace_s": 30}})


def _env(agent) -> dict:
    return {"BOARD_CONFIG": str(agent.config), "HOME": str(agent.root)}


def _file_env(tmp_path, url: str) -> dict:
    """`board` in file mode on the same database: the command opens it itself."""
    config = tmp_path / "board.toml"
    config.write_text(f'[storage]\ndb = "{tmp_path / "board.db"}"\nurl = "{url}"\n\n[fleet]\nhost = "gpu1"\n')
    return {"BOARD_CONFIG": str(config), "BOARD_SIMULATE": "1", "HOME": str(tmp_path),
            "XDG_STATE_HOME": str(tmp_path / "state")}


def _refused(cluster, then: str = "; nothing was changed") -> re.Pattern:
    """The one line of a refusal: the database's address, and its own words when the service's last try to reach it
    fell while it was stopping (the service keeps that try's reason through its backoff, so which of the two lines
    a command gets depends on when the agent last tried, not on the command)."""
    where = re.escape(f"{cluster.sockets}:5432")
    return re.compile(re.escape("board: the board database is unreachable (gpu1 → ") + where
                      + r"(: the database system is shutting down)?" + re.escape(")" + then) + "\n")


def _is_refusal(result: tuple[int, str, str], cluster, then: str = "; nothing was changed") -> bool:
    rc, out, err = result
    return rc == 1 and out == "" and _refused(cluster, then).fullmatch(err) is not None


def _wait_until(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.2)
    return found


def _answers_again(client) -> dict:
    """The service's status once it reads the database again (its connection's backoff has passed)."""
    def fresh():
        try:
            found = client.call("status")
        except Exception as error:  # noqa: BLE001 - the database not reconnected yet: its one line
            assert "unreachable" in str(error), error
            return None
        return found if "stale_since" not in found else None

    return _wait_until(fresh, BACK_S, "the service never read the database again")


WRITES = (("book", "2", "--for", "1h"), ("cancel", "{id}"), ("release", "{id}"), ("extend", "{id}", "--for", "3h"),
          ("book", "--cards", "3", "--every", "day", "--start", "9:00", "--until", "11:00", "--to", "{to}"),
          ("series", "cancel", "1"))


def test_writes_refuse_in_one_line_and_change_nothing_over_the_socket_and_in_file_mode(gpu1, pg_cluster, tmp_path):
    member = gpu1.client()
    now = int(time.time())
    booked = member.call("book", cards=[1], start=now, end=now + HOUR)
    before = member.call("list")["bookings"]
    to = time.strftime("%Y-%m-%d", time.gmtime(now + 3 * 86400))
    with paused(pg_cluster):
        for env in (_env(gpu1), _file_env(tmp_path, gpu1.storage_url)):
            for args in WRITES:
                # timeout: the connect timeout is 5 s; a refusal that hangs fails here, not by a timed assertion
                result = board_cli(*(a.format(id=booked["id"], to=to) for a in args), env=env, timeout=30)
                assert _is_refusal(result, pg_cluster), (args, result)
    _answers_again(member)
    assert member.call("list")["bookings"] == before  # nothing changed
    assert "Traceback" not in gpu1.log_text()
    member.close()


def test_reads_of_this_host_answer_from_the_last_state_marked_stale_and_the_marker_goes(gpu1, pg_cluster, tmp_path):
    member = gpu1.client()
    now = int(time.time())
    booked = member.call("book", cards=[1], start=now, end=now + HOUR, note="before the outage")
    last_read = member.call("status")["taken_at"]  # a read the service remembers (and its heartbeat, every second)
    events: queue.Queue = queue.Queue()
    watcher = gpu1.client()
    threading.Thread(target=lambda: [events.put(e) for e in watcher.subscribe(("fleet",))], daemon=True).start()
    with paused(pg_cluster):
        rc, out, err = board_cli("status", "--json", env=_env(gpu1), timeout=30)
        assert rc == 0, err
        found = json.loads(out)
        stale = datetime.fromisoformat(found["stale_since"]).timestamp()
        assert last_read - 5 <= stale <= time.time()
        card = found["cards"][1]
        assert (card["host"], card["booking"]["id"], card["booking"]["note"]) == ("gpu1", booked["id"],
                                                                                  "before the outage")
        assert [c["booking"] for c in found["cards"] if c["index"] != 1] == [None] * 7
        rc, out, err = board_cli("status", env=_env(gpu1), timeout=30)
        assert rc == 0, err
        assert out.splitlines()[-1] == (f"bookings as of {format_time(int(stale))}: the board database is unreachable;"
                                        " this host's cards only")
        # the board's window and fleet event carry the marker too (the TUI's header shows it)
        window = member.call("window", start=now - HOUR, end=now + 2 * HOUR)
        assert window["stale_since"] and [b["id"] for b in window["in_window"]] == [booked["id"]]
        assert [b["id"] for b in window["upcoming"]] == [booked["id"]]
        _wait_until(lambda: "stale_since" in events.get(timeout=30), 30, "no stale fleet event")
        # in file mode there is no service's state to read: one line
        result = board_cli("status", env=_file_env(tmp_path, gpu1.storage_url), timeout=30)
        assert _is_refusal(result, pg_cluster), result
    # back: fresh reads with no marker, writes work, without a restart
    _answers_again(member)
    rc, out, err = board_cli("status", "--json", env=_env(gpu1), timeout=30)
    assert rc == 0 and "stale_since" not in json.loads(out), err
    assert "bookings as of" not in board_cli("status", env=_env(gpu1))[1]
    _wait_until(lambda: "stale_since" not in events.get(timeout=30), 30, "the fleet event kept its marker")
    later = member.call("book", cards=[2], start=now, end=now + HOUR)
    assert later["host"] == "gpu1" and gpu1.starts == 1
    # the heartbeat says the outage once, and its end at its next beat
    _wait_until(lambda: "the board database answers again" in gpu1.log_text(), 30, "never said the database is back")
    log = gpu1.log_text()
    said = [line for line in log.splitlines() if "board agent: the board database is unreachable" in line]
    assert len(said) == 1, said
    watcher.close()
    member.close()


def test_list_answers_from_the_last_state_for_this_hosts_cards_and_refuses_what_is_not_kept(gpu1, pg_cluster,
                                                                                             tmp_path):
    config = Config(db_path=tmp_path / "board.db", storage_url=gpu1.storage_url,
                     history=HistorySettings(db=str(tmp_path / "gpu2.history.db")), fleet=FleetSettings(host="gpu2"))
    gpu2 = LocalClient.on(config, open_source(True, host="gpu2"), Identity("alice", 50001, False))
    beat(gpu2.service)  # gpu2's cards in the store, as its agent writes them
    gpu2.service.close()
    member = gpu1.client()
    now = int(time.time())
    here = member.call("book", cards=[1], start=now, end=now + HOUR, note="before the outage")
    later = member.call("book", cards=[2], start=now + 2 * HOUR, end=now + 3 * HOUR)
    there = member.call("book", cards=[3], host="gpu2", start=now, end=now + HOUR)
    gone = member.call("book", cards=[4], start=now, end=now + HOUR)
    member.call("cancel", id=gone["id"])
    listed = json.loads(board_cli("list", "--json", env=_env(gpu1))[1])
    assert [b["id"] for b in listed["bookings"]] == [here["id"], there["id"], later["id"]]
    assert "stale_since" not in listed
    member.call("status")  # a read the service remembers (and its heartbeat, every second): gpu2's booking too
    with paused(pg_cluster):
        rc, out, err = board_cli("list", "--json", env=_env(gpu1), timeout=30)
        assert rc == 0, err
        found = json.loads(out)
        # this host's live bookings as last read: not gpu2's, not the cancelled one; in the database's order
        assert [(b["id"], b["host"], b["note"]) for b in found["bookings"]] == [
            (here["id"], "gpu1", "before the outage"), (later["id"], "gpu1", "")]
        stale = datetime.fromisoformat(found["stale_since"]).timestamp()
        assert now - 5 <= stale <= time.time()
        note = (f"bookings as of {format_time(int(stale))}: the board database is unreachable; this host's cards"
                " only\n")
        assert err == note
        rc, out, err = board_cli("list", env=_env(gpu1), timeout=30)
        assert (rc, err) == (0, note)
        assert [line.split()[0] for line in out.splitlines()] == [f"#{here['id']}", f"#{later['id']}"], out
        # the filters the kept bookings answer: a window ahead, a user
        to = time.strftime("%Y-%m-%d %H:%M", time.gmtime(now + HOUR + 60))
        rc, out, err = board_cli("list", "--json", "--to", to, "--user", here["user"], env=_env(gpu1), timeout=30)
        assert rc == 0 and [b["id"] for b in json.loads(out)["bookings"]] == [here["id"]], err
        # and those that need what only the database keeps: one line naming the filter, exit 1, nothing on stdout
        result = board_cli("list", "--all", env=_env(gpu1), timeout=30)
        assert _is_refusal(result, pg_cluster,
                           "; --all needs past and cancelled bookings, which only the database keeps"), result
        since = time.strftime("%Y-%m-%d %H:%M", time.gmtime(now - HOUR))
        result = board_cli("list", "--from", since, env=_env(gpu1), timeout=30)
        assert _is_refusal(result, pg_cluster, f"; --from before {format_time(int(stale))} needs past bookings, which"
                           " only the database keeps"), result
    _answers_again(member)
    assert "stale_since" not in json.loads(board_cli("list", "--json", env=_env(gpu1))[1])
    member.close()


def _run_job(agent, booking: int) -> subprocess.Popen:
    """A real `board run` job (root's: root books over the socket here), a process group of its own."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TZ": "UTC", **_env(agent)}
    return subprocess.Popen([str(BOARD), "run", "--booking", str(booking), "--", "sleep", "600"], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, process_group=0)


def test_enforcement_continues_from_the_bookings_last_known(gpu1, pg_cluster):
    member = gpu1.client()
    notices: queue.Queue = queue.Queue()
    listener = gpu1.client()
    threading.Thread(target=lambda: [notices.put(e) for e in listener.subscribe(("notice",))], daemon=True).start()
    now = int(time.time())
    # both end within ten minutes, so the enforcer's notice shows it has read each job's booking
    staying = member.call("book", cards=[1], start=now, end=now + 9 * 60)
    ending = member.call("book", cards=[2], start=now, end=now + 20)
    jobs = {b["id"]: _run_job(gpu1, b["id"]) for b in (staying, ending)}
    try:
        told = set()
        while len(told) < 2:  # "booking N ends in M min; your job (pid P) will be stopped then"
            message = notices.get(timeout=30)["message"]
            told |= {b for b in jobs if message.startswith(f"booking {b} ends in")}
        with paused(pg_cluster):
            # the ended booking's job is stopped from what the enforcer knew; the live one's runs on
            assert jobs[ending["id"]].wait(timeout=60) == -15, jobs[ending["id"]].stderr.read()
            assert jobs[staying["id"]].poll() is None
            _wait_until(lambda: f"job-stop of booking {ending['id']} not audited" in gpu1.log_text(), 30,
                        "the stop was not said in the log")
        _answers_again(member)
        # every pass while the database was away has finished by now (one database thread): the live job ran on
        _wait_until(lambda: "the board database answers again" in gpu1.log_text(), BACK_S, "never back")
        assert jobs[staying["id"]].poll() is None
        assert f"job {jobs[staying['id']].pid} " not in gpu1.log_text()
    finally:
        for job in jobs.values():
            if job.poll() is None:
                os.killpg(job.pid, 9)
            job.wait(timeout=10)
    member.close()
    listener.close()
