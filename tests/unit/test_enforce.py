"""`board run` jobs under the service, in process: who may run on a booking (run_booking), and one
enforcement pass (enforce_once) over real child processes registered by pidfd, on a clock the test moves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest

from app.alerts.engine import Engine
from app.config import Config, EnforceSettings
from app.core.identity import Identity
from app.errors import BadInput, Conflict, NotPermitted
from app.gpu import open_source
from app.gpu.fleet import Fleet
from app.service import Service
from app.service.box.enforce import WARN_BEFORE_END_S, enforce_once, is_over, run_booking
from app.store import events, jobs
from app.store.db import write
from tests.conftest import Clock, FROZEN_NOW

ALICE = Identity("alice", os.getuid(), False)
BOB = Identity("bob", os.getuid() + 1, False)
ADMIN = Identity("root", 0, True)
# Ignores SIGTERM, so that only the SIGKILL after the grace ends it; says when the handler is in place.
STUBBORN = [sys.executable, "-c",
            "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True);"
            " time.sleep(60)"]
GRACE_S = 30




@pytest.fixture
def clock():
    return Clock(FROZEN_NOW)


def make_service(tmp_path, clock, run_jobs: str = "stop") -> Service:
    config = Config(db_path=tmp_path / "board.db", enforce=EnforceSettings(grace_s=GRACE_S, run_jobs=run_jobs))
    return Service(config, Fleet(open_source(True, clock=clock), 1.0), clock=clock)


@pytest.fixture
def service(tmp_path, clock):
    service = make_service(tmp_path, clock)
    yield service
    service.processes.close()
    service.close()


@pytest.fixture
def stubborn():
    process = subprocess.Popen(STUBBORN, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    yield process
    process.kill()
    process.wait()


def book(service: Service, me: Identity = ALICE, *, cards=(0,), start: int = FROZEN_NOW, hours: float = 1):
    return service.bookings(me).create(cards=list(cards), start=start, end=start + int(hours * 3600))


def register(service: Service, booking, process: subprocess.Popen):
    entry = service.processes.add("job", booking.id, os.getuid(), process.pid, booking.card_uuids)
    with write(service.conn):
        jobs.remember(service.conn, pid=entry.pid, started_ticks=entry.started_ticks, booking_id=booking.id,
                      uid=entry.uid, pgid=entry.pgid, cards=entry.cards, now=FROZEN_NOW, host=service.host)
    return entry


def server_of(service: Service, log: list | None = None) -> SimpleNamespace:
    """What enforce_once needs of a ServiceServer: the service, its registry, a log, the alerts' engine and how far
    started bookings have been announced."""
    return SimpleNamespace(service=service, registry=service.processes, log=(log if log is not None else []).append,
                           alerts=Engine(), started_told_until=None)


def stops(service: Service, action: str = "job-stop") -> list[tuple]:
    found = audited(service, action)
    assert all(e.details["host"] == service.host for e in found)  # the host whose service stopped it
    return [(e.actor, e.uid, e.booking_id, e.ok, {k: v for k, v in e.details.items() if k != "host"}) for e in found]


def audited(service: Service, action: str) -> list:
    return [e for e in events.recent(service.conn, limit=100) if e.action == action]


def ended(process: subprocess.Popen) -> bool:
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return True


# -- who may run ---------------------------------------------------------------------------------


def test_the_only_active_booking_is_the_one_run_takes(service):
    booking = book(service)
    book(service, start=FROZEN_NOW + 7200)  # later: not active, not a second choice
    assert run_booking(service, ALICE, None).id == booking.id
    assert run_booking(service, ALICE, booking.id).id == booking.id


def test_run_on_someone_else_s_booking_is_refused_and_audited(service):
    booking = book(service, BOB)
    with pytest.raises(NotPermitted, match=f"booking {booking.id} belongs to bob; run on your own booking"):
        run_booking(service, ALICE, booking.id)
    refusals = audited(service, "run")
    assert [(e.actor, e.ok, e.booking_id) for e in refusals] == [("alice", False, booking.id)]
    assert "belongs to bob" in refusals[0].details["refused"]


def test_an_admin_cannot_run_on_someone_else_s_booking_either(service):
    booking = book(service, BOB)
    with pytest.raises(NotPermitted, match="belongs to bob"):
        run_booking(service, ADMIN, booking.id)


def test_run_on_a_booking_that_has_not_started_is_refused(service, clock):
    booking = book(service, start=FROZEN_NOW + 3600)
    with pytest.raises(NotPermitted, match=rf"^booking {booking.id} is not active now \(starts \S+, in 60 min\)$"):
        run_booking(service, ALICE, booking.id)
    clock.now = booking.start  # from its first second it is
    assert run_booking(service, ALICE, booking.id).id == booking.id
    clock.now = booking.end  # from its last second it has ended
    with pytest.raises(NotPermitted, match=r"not active now \(ended \S+, now\)$"):
        run_booking(service, ALICE, booking.id)
    clock.now = booking.end + 7200
    with pytest.raises(NotPermitted, match=r"not active now \(ended \S+, 2 h ago\)$"):
        run_booking(service, ALICE, booking.id)


def test_run_without_an_active_booking_says_how_to_book(service):
    book(service, BOB)  # someone else's active booking is not the caller's
    with pytest.raises(NotPermitted) as refused:
        run_booking(service, ALICE, None)
    assert str(refused.value) == "you have no active booking; book cards first: board book 1 --for 2h"
    assert [e.ok for e in audited(service, "run")] == [False]


def test_a_booking_that_starts_in_a_second_is_not_active_yet(service, clock):
    booking = book(service, start=FROZEN_NOW + 1)
    with pytest.raises(NotPermitted, match="no active booking"):
        run_booking(service, ALICE, None)
    clock.now += 1
    assert run_booking(service, ALICE, None).id == booking.id


def test_two_active_bookings_ask_which_one_and_audit_nothing(service):
    book(service, cards=(0,))
    book(service, cards=(1,))
    with pytest.raises(BadInput, match="you hold 2 active bookings; pick one with --booking ID"):
        run_booking(service, ALICE, None)
    assert audited(service, "run") == []


def test_run_on_a_booking_that_does_not_exist_is_bad_input(service):
    with pytest.raises(BadInput, match="no booking 99"):
        run_booking(service, ALICE, 99)


# -- when is a job's booking over ----------------------------------------------------------------


def entry_for(booking, uid=None, cards=None):
    return SimpleNamespace(uid=booking.uid if uid is None else uid,
                           cards=tuple(booking.card_uuids if cards is None else cards))


def test_a_booking_is_over_for_its_job_when_ended_gone_moved_or_given_away(service):
    booking = book(service, cards=(0, 1))
    entry = entry_for(booking)
    assert not is_over(booking, entry, FROZEN_NOW)
    assert not is_over(booking, entry_for(booking, cards=reversed(booking.card_uuids)), FROZEN_NOW)  # order is no move
    assert is_over(None, entry, FROZEN_NOW)
    assert is_over(booking, entry, booking.end)
    assert not is_over(booking, entry, booking.end - 1)
    assert is_over(booking, entry_for(booking, uid=booking.uid + 1), FROZEN_NOW)
    assert is_over(booking, entry_for(booking, cards=booking.card_uuids[:1]), FROZEN_NOW)


# -- a booking starts ----------------------------------------------------------------------------


def test_each_holder_hears_once_that_their_booking_has_started(service, clock):
    """A fresh service's first pass announces nothing (what started before it is old news); each later pass tells
    the holder alone of each booking that started since the pass before, one starting at that very second included,
    and never twice."""
    book(service)  # running when the service starts
    at_the_pass = book(service, cards=(1, 2), start=FROZEN_NOW + 100)
    bobs = book(service, BOB, cards=(3,), start=FROZEN_NOW + 50)
    next_second = book(service, cards=(4,), start=FROZEN_NOW + 101)
    to_alice = service.hub.subscribe({"notice"}, uid=ALICE.uid)
    to_bob = service.hub.subscribe({"notice"}, uid=BOB.uid)
    server = server_of(service)

    def told(subscriber) -> list[str]:
        return [n["message"] for n in subscriber.take(timeout=0)]

    enforce_once(server)
    assert told(to_alice) == told(to_bob) == []
    clock.now = FROZEN_NOW + 100
    enforce_once(server)
    assert told(to_alice) == [f"booking {at_the_pass.id} has started: cards 1,2 until"
                              f" <@time:{at_the_pass.end}:{FROZEN_NOW + 100}>"]
    assert told(to_bob) == [f"booking {bobs.id} has started: cards 3 until <@time:{bobs.end}:{FROZEN_NOW + 100}>"]
    clock.now = FROZEN_NOW + 101
    enforce_once(server)
    assert told(to_alice) == [f"booking {next_second.id} has started: cards 4 until"
                              f" <@time:{next_second.end}:{FROZEN_NOW + 101}>"]
    assert told(to_bob) == []


# -- one enforcement pass ------------------------------------------------------------------------


def test_a_job_runs_untouched_while_its_booking_lasts(service, stubborn):
    booking = book(service)
    entry = register(service, booking, stubborn)
    subscriber = service.hub.subscribe({"notice"}, uid=os.getuid())
    done = enforce_once(server_of(service))
    assert done["terminated"] == done["killed"] == done["warned"] == done["ended"] == []
    assert stubborn.poll() is None and not entry.warned
    assert subscriber.take(timeout=0) == []
    assert done["planned_started"] == []  # no planned server was due


def test_the_holder_is_told_once_when_ten_minutes_are_left(service, clock, stubborn):
    booking = book(service)
    entry = register(service, booking, stubborn)
    subscriber = service.hub.subscribe({"notice"}, uid=os.getuid())
    clock.now = booking.end - WARN_BEFORE_END_S - 1
    enforce_once(server_of(service))
    assert subscriber.take(timeout=0) == [] and not entry.warned
    clock.now = booking.end - WARN_BEFORE_END_S
    enforce_once(server_of(service))
    notices = subscriber.take(timeout=0)
    assert [n["message"] for n in notices] == [
        f"booking {booking.id} ends in 10 min; your job (pid {stubborn.pid}) will be stopped then"]
    clock.now += 60
    enforce_once(server_of(service))
    assert subscriber.take(timeout=0) == []  # once
    assert stubborn.poll() is None


@pytest.mark.parametrize("left_s, says", [(61, "ends in 2 min;"), (30, "ends in 1 min;")])
def test_the_notice_rounds_the_minutes_up(service, clock, stubborn, left_s, says):
    booking = book(service)
    register(service, booking, stubborn)
    subscriber = service.hub.subscribe({"notice"}, uid=os.getuid())
    clock.now = booking.end - left_s
    enforce_once(server_of(service))
    assert says in subscriber.take(timeout=0)[0]["message"]


def test_the_notice_goes_to_the_holder_alone(service, clock, stubborn):
    booking = book(service)
    register(service, booking, stubborn)
    someone_else = service.hub.subscribe({"notice"}, uid=os.getuid() + 1)
    clock.now = booking.end - 60
    enforce_once(server_of(service))
    assert someone_else.take(timeout=0) == []


def test_every_registration_is_looked_at_in_one_pass(service, clock, stubborn):
    """A server's registration and a job whose booking still runs come first; the job after them is still stopped."""
    server_booking = book(service, cards=(2,), hours=0.5)
    running = book(service, cards=(0,), hours=2)
    ending = book(service, cards=(1,), hours=0.5)
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as first, \
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as second:
        try:
            service.processes.add("server", server_booking.id, os.getuid(), first.pid, server_booking.card_uuids)
            register(service, running, second)
            entry = register(service, ending, stubborn)
            clock.now = ending.end
            assert enforce_once(server_of(service))["terminated"] == [entry.id]
            assert first.poll() is None and second.poll() is None  # a server is enforce_servers' to stop
        finally:
            first.kill()
            second.kill()


def test_a_job_past_its_booking_gets_sigterm_then_sigkill_after_the_grace(service, clock, stubborn):
    booking = book(service)
    entry = register(service, booking, stubborn)
    log: list[str] = []
    server = server_of(service, log)
    clock.now = booking.end
    assert enforce_once(server)["terminated"] == [entry.id]
    assert entry.term_sent_at == booking.end
    term = {"pid": stubborn.pid, "signal": "SIGTERM", "pids": [stubborn.pid], "grace_s": GRACE_S}
    assert stops(service) == [("board-agent", os.getuid(), booking.id, True, term)]
    assert log == [f"job {stubborn.pid} (uid {os.getuid()}): booking {booking.id} ended; SIGTERM"]
    assert stubborn.poll() is None  # it ignores SIGTERM

    clock.now = booking.end + GRACE_S - 1
    done = enforce_once(server)
    assert done["terminated"] == done["killed"] == [] and stubborn.poll() is None

    clock.now = booking.end + GRACE_S
    assert enforce_once(server)["killed"] == [entry.id]
    assert ended(stubborn) and stubborn.returncode == -signal.SIGKILL
    kill = {"pid": stubborn.pid, "signal": "SIGKILL", "pids": [stubborn.pid]}
    assert stops(service) == [("board-agent", os.getuid(), booking.id, True, kill),
                              ("board-agent", os.getuid(), booking.id, True, term)]
    assert log[1:] == [f"job {stubborn.pid} (uid {os.getuid()}): still running after {GRACE_S} s; SIGKILL"]

    clock.now += 1
    done = enforce_once(server)
    assert done["ended"] == [entry.id] and done["killed"] == []
    assert jobs.remembered(service.conn, service.host) == []  # a restarted service would not adopt it


def test_a_job_that_heeds_sigterm_is_not_killed(service, clock):
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        booking = book(service)
        entry = register(service, booking, process)
        clock.now = booking.end
        enforce_once(server_of(service))
        assert ended(process) and process.returncode == -signal.SIGTERM
        clock.now += GRACE_S
        done = enforce_once(server_of(service))
        assert done["ended"] == [entry.id] and done["killed"] == []
        assert [e.details["signal"] for e in audited(service, "job-stop")] == ["SIGTERM"]
    finally:
        process.kill()
        process.wait()


def test_a_cancelled_booking_stops_its_job_at_once(service, stubborn):
    booking = book(service)
    entry = register(service, booking, stubborn)
    service.bookings(ALICE).release(booking.id)
    assert enforce_once(server_of(service))["terminated"] == [entry.id]


def test_a_booking_moved_to_other_cards_stops_its_job(service, clock, stubborn):
    booking = book(service, start=FROZEN_NOW)
    entry = register(service, booking, stubborn)
    clock.now += 600
    moved = service.bookings(ADMIN).reassign(booking.id, cards=[5], force=True)
    assert moved.id != booking.id  # split at now: the job's piece ended
    assert enforce_once(server_of(service))["terminated"] == [entry.id]


def test_a_booking_given_to_someone_else_waits_for_its_job_unless_forced_and_then_stops_it(service, clock, stubborn):
    booking = book(service, start=FROZEN_NOW)
    entry = register(service, booking, stubborn)
    clock.now += 600
    admin = service.bookings(ADMIN)
    admin.users = {"bob": ("bob", BOB.uid)}.get
    with pytest.raises(Conflict, match=f"has job {stubborn.pid} running on cards 0; stop it first, or pass --force to"
                                       " stop it and give the booking to bob"):
        admin.reassign(booking.id, user="bob")
    assert enforce_once(server_of(service))["terminated"] == []
    given = admin.reassign(booking.id, user="bob", force=True)
    assert (given.user, given.start) == ("bob", clock.now)  # split at now: the job's piece ended
    assert enforce_once(server_of(service))["terminated"] == [entry.id]


def test_a_server_on_a_booking_that_changed_hands_is_stopped_as_if_it_ended(service, clock):
    """A reassign forced over a server splits a started booking (the server's piece ends); one given away in the very
    second it started cannot split, and keeps its id: the enforcer still stops the old holder's server, as it stops
    a job whose booking changed hands (is_over). The holder's own server on a live booking is not touched."""
    from app.llama import rows

    conn = service.conn
    given, kept = book(service, start=FROZEN_NOW), book(service, cards=(1,), start=FROZEN_NOW)
    with write(conn):
        ids = [rows.insert(conn, booking_id=b.id, user="alice", uid=ALICE.uid, cards=list(b.cards),
                           card_uuids=b.card_uuids, model="/m.gguf", alias=None, host="127.0.0.1", port=port, ctx=256,
                           parallel=1, split_mode="layer", metrics=False, cmdline=["llama-server"], now=FROZEN_NOW)
               for b, port in ((given, 8001), (kept, 8002))]
    assert rows.ended_bookings(conn, int(clock()), "") == []
    admin = service.bookings(ADMIN)
    admin.users = {"bob": ("bob", BOB.uid)}.get
    assert admin.reassign(given.id, user="bob", force=True).id == given.id  # at its start: no past to split off
    assert [s.id for s in rows.ended_bookings(conn, int(clock()), "")] == [ids[0]]


def test_warn_mode_audits_once_and_leaves_the_job_running(tmp_path, clock, stubborn):
    service = make_service(tmp_path, clock, run_jobs="warn")
    later = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        booking = book(service)
        other = book(service, cards=(1,), hours=2)
        entry = register(service, booking, stubborn)
        second = register(service, other, later)
        clock.now = booking.end
        assert enforce_once(server_of(service))["warned"] == [entry.id]
        clock.now = other.end  # the first, warned already, comes before the second in the pass
        assert enforce_once(server_of(service))["warned"] == [second.id]
        for _ in range(2):
            clock.now += GRACE_S
            done = enforce_once(server_of(service))
            assert done["warned"] == done["terminated"] == done["killed"] == []
        assert stops(service, "job-warn") == [("board-agent", os.getuid(), other.id, True, {"pid": later.pid}),
                                              ("board-agent", os.getuid(), booking.id, True, {"pid": stubborn.pid})]
        assert audited(service, "job-stop") == []
        assert stubborn.poll() is None and later.poll() is None
    finally:
        later.kill()
        later.wait()
        service.processes.close()
        service.close()


def test_warn_mode_after_the_ten_minute_notice_still_audits_the_end(tmp_path, clock, stubborn):
    service = make_service(tmp_path, clock, run_jobs="warn")
    try:
        booking = book(service)
        entry = register(service, booking, stubborn)
        clock.now = booking.end - 60
        enforce_once(server_of(service))
        assert entry.warned
        clock.now = booking.end
        assert enforce_once(server_of(service))["warned"] == [entry.id]
    finally:
        service.processes.close()
        service.close()


def test_a_service_reconciles_and_stops_only_its_own_hosts_servers(tmp_path, clock):
    """Two hosts on one store: gpu1's pass finds gpu1's server gone and its booking ended, and leaves gpu2's twin
    (the same pid, the same ended booking) alone: that pid means nothing on gpu1."""
    from app.config import FleetSettings
    from app.llama import rows
    from app.llama.service import ServerService

    config = Config(db_path=tmp_path / "board.db", fleet=FleetSettings(host="gpu1"))
    service = Service(config, Fleet(open_source(True, clock=clock), 1.0), clock=clock)
    conn = service.conn
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    try:
        booking = book(service)
        with write(conn):
            ids = {host: rows.insert(conn, booking_id=booking.id, user="alice", uid=ALICE.uid, cards=[0],
                                     card_uuids=booking.card_uuids, model="/m.gguf", alias=None, host="127.0.0.1",
                                     port=port, ctx=256, parallel=1, split_mode="layer", metrics=False,
                                     cmdline=["llama-server"], now=FROZEN_NOW, fleet_host=host)
                   for host, port in (("gpu1", 8001), ("gpu2", 8002))}
            for server_id in ids.values():
                rows.transition(conn, server_id, [rows.STARTING], rows.READY, pid=int(gone.stdout))
        clock.now += 2 * 3600
        assert [s.id for s in rows.ended_bookings(conn, int(clock()), "gpu1")] == [ids["gpu1"]]
        assert [s.id for s in rows.live(conn, "gpu2")] == [ids["gpu2"]]
        changed = ServerService(conn, ADMIN, config, clock=clock).reconcile()
        assert [s.id for s in changed] == [ids["gpu1"]]
        assert rows.get(conn, ids["gpu1"]).state == rows.CRASHED
        assert rows.get(conn, ids["gpu2"]).state == rows.READY
    finally:
        service.processes.close()
        service.close()
