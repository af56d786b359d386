"""Idle bookings given back ([policy] idle_release_after_min): the real service and its enforcement pass on a real
database, the simulated fleet sampled into the real history by the real sampler, a clock the test moves.

Each minute the clock moves, the sampler samples the cards and the pass runs on the agent's database thread, as
`board agent` does every [enforce] interval_s. The limit is short: idle for 30 minutes, told 10 minutes before.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess

import pytest

from app.config import AlertSettings, Config, HistorySettings, NotifySettings, NotifyTarget, Policy
from app.core.identity import Identity
from app.gpu.fleet import Fleet
from app.gpu.model import GpuProcess
from app.gpu.simulated import SimulatedSource, parse_scenario
from app.history.sampler import Sampler
from app.service import Service
from app.service.box.idle import idle_card
from app.service.box.metrics import BoardCollector
from app.service.door.server import ServiceServer
from app.store import events
from app.store.db import write
from tests.conftest import FROZEN_NOW, Clock

ALICE = Identity("alice", 1001, False)
BOB_PROCESS = GpuProcess(52001, 2048, "bob", 1002, "python train.py")
ALICE_PROCESS = GpuProcess(52002, 2048, "alice", 1001, "python train.py")
CONTAINER_PROCESS = GpuProcess(52003, 2048, None, None, "")  # a PID from a container: nobody can say whose
AFTER, NOTICE = 30, 10


class Board:
    """The agent (Service + ServiceServer, on the database thread), its sampler, and the test's clock."""

    def __init__(self, tmp_path, store, **policy) -> None:
        self.clock = Clock(FROZEN_NOW)
        settings = {"idle_release_after_min": AFTER, "idle_release_notice_min": NOTICE, "idle_release_grace_min": 0,
                    **policy}
        config = Config(db_path=tmp_path / "board.db", storage_url=getattr(store, "url", None),
                        policy=Policy(timezone="UTC", **settings),
                        history=HistorySettings(sample_s=60), alerts=AlertSettings(enabled=False),
                        notify=NotifySettings(targets=(NotifyTarget("chat", "webhook", "http://127.0.0.1:9/hook"),)))
        self.source = SimulatedSource(parse_scenario({"cards": {"count": 4}}), clock=self.clock)
        self.service = Service(config, Fleet(self.source, 1.0, clock=self.clock), clock=self.clock)
        self.server = ServiceServer(self.service, str(tmp_path / "agent.sock"))
        self.sampler = Sampler(self.service.fleet, self.service.history, config, self.clock)
        self.notices = self.service.hub.subscribe({"notice"}, uid=ALICE.uid)
        self.passes: list[dict] = []

    def call(self, me: Identity, op: str, **args):
        return self.server.database.call(me, op, args).result()

    def book(self, me: Identity = ALICE, cards=(0, 1), hours: float = 4) -> int:
        now = int(self.clock.now)
        return self.call(me, "book", cards=list(cards), start=now, end=now + int(hours * 3600))["id"]

    def at(self, offset_s: float, sample: bool = True) -> dict:
        """The clock at FROZEN_NOW + offset_s: one sample of the cards (unless the sampler is down), then one
        enforcement pass."""
        self.clock.now = FROZEN_NOW + offset_s
        if sample:
            self.sampler.sample_once()
        done = self.server.database.submit(self.server.enforce_once).result()
        self.passes.append(done)
        return done

    def minutes(self, first: int, last: int, sample: bool = True) -> None:
        """A pass at each whole minute from `first` to `last`, both included."""
        for minute in range(first, last + 1):
            self.at(minute * 60, sample)

    def happened(self, what: str) -> list[int]:
        return [b for done in self.passes for b in done.get(what, [])]

    def booking(self, booking_id: int) -> dict:
        return self.call(ALICE, "get", id=booking_id)

    def pushes(self) -> list[tuple[str, str]]:
        return [(kind, json.loads(message)["title"]) for kind, message in
                self.service.conn.execute("SELECT kind, message FROM outbox ORDER BY id")]

    def told(self) -> list[str]:
        return [e["message"] for e in self.notices.take(0) if e["event"] == "notice"]

    def close(self) -> None:
        self.server.database.shutdown()
        self.service.close()


@pytest.fixture
def make(tmp_path, store):
    """make(**policy): a Board on SQLite, or on a fresh PostgreSQL database."""
    made: list[Board] = []

    def board(**policy) -> Board:
        made.append(Board(tmp_path, store, **policy))
        return made[-1]

    yield board
    for board in made:
        board.close()


def test_an_idle_booking_is_told_then_released_and_the_queue_moves_up(make):
    """Idle from its start (its first sample at minute 0): told at minute 20 exactly, released at 30 exactly, its
    past kept, audited as the board's with why (and counted on /metrics); bob's queued booking behind it moves up.
    Wrong versions it fails on: the notice skipped (released with no notice, or none in the chat); off by one on
    the minute boundary (told at 19:59 or released at 29:59, or a minute late); released without the backfill."""
    board = make()
    booking = board.book()
    bob = Identity("bob", 1002, False)
    queued = board.call(bob, "book", cards=[0, 1], start=int(FROZEN_NOW), end=int(FROZEN_NOW) + 3600, or_later=True)
    assert queued["start"] == int(FROZEN_NOW) + 4 * 3600  # after alice's, waiting to move up
    board.minutes(0, 19)
    board.at(19 * 60 + 59)
    assert board.happened("idle_told") == [] and board.told() == []
    board.at(20 * 60)
    assert board.happened("idle_told") == [booking]
    assert board.told() == [f"booking {booking} on cards 0,1 is idle: released in 10 min unless used"]
    assert board.pushes() == [("idle.notice", f"booking {booking} of alice on cards 0,1 is idle: released in 10 min"
                                              " unless used")]
    assert board.booking(booking)["notice"].startswith("idle since")
    board.minutes(21, 29)
    board.at(29 * 60 + 59)
    assert board.happened("idle_released") == [] and board.happened("idle_told") == [booking]  # told once
    assert board.booking(booking)["end"] == int(FROZEN_NOW) + 4 * 3600
    board.at(30 * 60)
    assert board.happened("idle_released") == [booking]
    released = board.booking(booking)
    assert (released["start"], released["end"], released["status"]) == (int(FROZEN_NOW), int(FROZEN_NOW) + 1800,
                                                                          "booked")
    event = events.recent(board.service.conn, booking_id=booking)[0]
    assert (event.actor, event.action, event.ok) == ("board", "idle_release", True)
    assert {k: event.details[k] for k in ("idle_since", "idle_min", "idle_util_pct")} == {
        "idle_since": int(FROZEN_NOW), "idle_min": 30, "idle_util_pct": 10.0}
    assert board.told()[-1] == f"booking {booking} on cards 0,1 was released: idle for 30 min (no process of yours," \
                               " at most 10 % busy)"
    assert board.pushes()[-1] == ("idle.released", f"booking {booking} of alice on cards 0,1 released: idle for 30 min")
    assert board.booking(queued["id"])["start"] == int(FROZEN_NOW) + 1800  # the queue moved up into the time
    counted = {family.name: family.samples for family in BoardCollector(board.service).collect()}
    assert [s.value for s in counted["board_idle_releases"]] == [1]  # /metrics counts it from the audit log


@pytest.mark.parametrize("process, released", [(ALICE_PROCESS, False), (CONTAINER_PROCESS, False),
                                               (BOB_PROCESS, True)], ids=["holders", "container", "squatters"])
def test_only_the_holders_processes_keep_a_booking(make, process, released):
    """With any utilisation counting as idle (idle_util_pct 100), only whose process runs on card 1 decides: the
    holder's, or one nobody can attribute (perhaps the holder's container), keeps the booking; a squatter's does not.
    Wrong versions it fails on: another user's process counted as the holder's (the squatter keeps it); the process
    check dropped (the holder's own run released); an unattributed process taken for nobody's."""
    board = make(idle_util_pct=100)
    booking = board.book()
    board.source.set_extra_processes({1: (process,)})
    board.minutes(0, 40)
    assert board.happened("idle_released") == ([booking] if released else [])
    assert board.happened("idle_told") == ([booking] if released else [])


def test_a_busy_card_keeps_a_booking_until_it_is_idle_for_the_whole_limit(make):
    """The holder's job on card 1 until minute 15 (over idle_util_pct): the idle clock starts when it ends.
    Wrong versions it fails on: idle counted from the booking's start (released at 30); one card idle taken for the
    booking idle."""
    board = make()
    booking = board.book()
    board.source.set_extra_processes({1: (ALICE_PROCESS,)})
    board.minutes(0, 15)
    board.source.set_extra_processes({})
    board.minutes(16, 45)
    assert board.happened("idle_released") == [] and board.happened("idle_told") == [booking]
    board.minutes(46, 46)
    assert board.happened("idle_released") == [booking]


def test_busy_after_the_notice_withdraws_it_and_the_clock_restarts(make):
    """Told at minute 20; the holder starts work at 25: not released, told so; idle again from 27, told again at 47
    and released at 57.
    Wrong versions it fails on: the notice never withdrawn (released at 30 anyway, or the first notice's time kept);
    the holder not told of the withdrawal; the clock not restarted (released at 30 or 37)."""
    board = make()
    booking = board.book()
    board.minutes(0, 24)
    assert board.happened("idle_told") == [booking]
    board.source.set_extra_processes({0: (ALICE_PROCESS,)})
    board.minutes(25, 26)
    assert board.happened("idle_withdrawn") == [booking]
    assert board.told()[-1] == f"booking {booking} is in use again: it will not be released"
    assert board.booking(booking)["notice"] == "in use again: not released"
    assert board.pushes()[-1] == ("idle.withdrawn", f"booking {booking} of alice is in use again: not released")
    board.source.set_extra_processes({})
    board.minutes(27, 56)
    assert board.happened("idle_released") == [] and board.happened("idle_told") == [booking, booking]
    board.minutes(57, 57)
    assert board.happened("idle_released") == [booking]


def test_a_process_the_cards_show_now_counts_before_the_next_sample(make):
    """Told at 20; the holder starts work at 29:40 and the pass at 30:00 comes before the sampler's next sample: the
    cards' readings now keep the booking.
    Wrong version it fails on: only the history asked (released on a sample up to [history] sample_s old)."""
    board = make()
    booking = board.book()
    board.minutes(0, 29)
    board.source.set_extra_processes({1: (ALICE_PROCESS,)})
    board.at(30 * 60, sample=False)
    assert board.happened("idle_released") == [] and board.happened("idle_withdrawn") == [booking]


def test_never_in_its_first_grace_minutes(make):
    """Grace 45 minutes, longer than the 30-minute limit: idle from its start, told at 35, released at 45.
    Wrong versions it fails on: the grace ignored (released at 30); the notice given without the grace (at 20)."""
    board = make(idle_release_grace_min=45)
    booking = board.book()
    board.minutes(0, 34)
    assert board.happened("idle_told") == []
    board.minutes(35, 44)
    assert board.happened("idle_told") == [booking] and board.happened("idle_released") == []
    board.minutes(45, 45)
    assert board.happened("idle_released") == [booking]


def test_off_by_default_never_released(make):
    """No idle_release_after_min: hours idle, nothing told, nothing released.
    Wrong version it fails on: a default limit (the option on when left out)."""
    board = make(idle_release_after_min=None)
    booking = board.book(hours=6)
    board.minutes(0, 240)
    assert board.happened("idle_told") == board.happened("idle_released") == []
    assert board.booking(booking)["end"] == int(FROZEN_NOW) + 6 * 3600 and board.pushes() == []


def test_a_live_server_keeps_its_booking(make, monkeypatch):
    """A llama-server starting on the booking (its row live; the launch grace kept open so that the reconcile,
    which has no supervisor to ask here, leaves it live): idle cards or not, never told, never released.
    Wrong version it fails on: live_server_ids not asked."""
    monkeypatch.setattr("app.llama.service.LAUNCH_GRACE_S", 10**9)
    board = make()
    booking = board.book()
    with write(board.service.conn):
        board.service.conn.execute(
            'INSERT INTO servers (booking_id, "user", uid, cards, card_uuids, model, host, port, cmdline, state,'
            " created_at) VALUES (?, 'alice', 1001, '[0, 1]', '[]', '/m.gguf', '127.0.0.1', 8100, '[]', 'starting', ?)",
            (booking, int(FROZEN_NOW)))
    board.minutes(0, 60)
    assert board.happened("idle_told") == board.happened("idle_released") == []


def test_a_board_run_job_keeps_its_booking(make):
    """A `board run` job registered for the booking (a real process of the holder's, held by its pidfd), its cards
    idle: never released. Once it ends, the idle clock's run (from the history) counts, and the booking goes.
    Wrong version it fails on: the registered jobs not asked."""
    board = make()
    me = pwd.getpwuid(os.geteuid())
    holder = Identity(me.pw_name, me.pw_uid, False)
    booking = board.book(holder)
    job = subprocess.Popen(["sleep", "600"])
    try:
        uuids = tuple(board.booking(booking)["card_uuids"])
        board.service.processes.add("job", booking, me.pw_uid, job.pid, cards=uuids)
        board.minutes(0, 60)
        assert board.happened("idle_told") == board.happened("idle_released") == []
    finally:
        job.kill()
        job.wait()
    board.minutes(61, 61)  # the pass sweeps the ended job; idle on the cards since minute 0: told now
    assert board.happened("idle_told") == [booking]
    board.minutes(62, 70)  # long past the limit, but the holder has the whole notice
    assert board.happened("idle_released") == []
    board.minutes(71, 71)
    assert board.happened("idle_released") == [booking]


def test_a_gap_in_the_history_is_not_idle_time(make):
    """The sampler down from minute 6 to 25 (nobody saw what ran): the idle run starts again when it is back, so
    told at 46, released at 56.
    Wrong version it fails on: a gap between samples (or since the newest) counted as idle."""
    board = make()
    booking = board.book()
    board.minutes(0, 5)
    board.minutes(6, 25, sample=False)
    board.minutes(26, 45)
    assert board.happened("idle_told") == []
    board.minutes(46, 55)
    assert board.happened("idle_told") == [booking] and board.happened("idle_released") == []
    board.minutes(56, 56)
    assert board.happened("idle_released") == [booking]


@pytest.mark.parametrize("util, users, idle", [
    (10, (), True), (11, (), False), (None, (), False), (0, ("bob",), True), (0, ("alice",), False),
    (0, ("container/unknown",), False)])
def test_idle_card(util, users, idle):
    """At or under the percentage (10 is idle, 11 not), known, with no process of the holder's or nobody's."""
    assert idle_card(util, users, "alice", 10.0) is idle
