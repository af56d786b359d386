"""On-demand bookings (the catalog's, [[models]]) through BookingService on a real store, the clock pinned: what an
on-demand booking is exempt from and what it keeps, `within`, and the lease. SQLite, then PostgreSQL (the `conn`
fixture's second store, marked `postgresql`).

The runner's account (board-llama) holds every on-demand booking. Project A (alice) may use online; [classes] gives
online to alice alone; a member holds one card at once, for an hour at most, a day ahead at most.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from msgspec.structs import replace

from app.config import ClassWindow, Config, Policy, Pool, Project, ProjectAllocation
from app.core.identity import Identity
from app.errors import BadInput, Conflict, NotPermitted
from app.gpu.model import GpuProcess
from app.service.rules.bookings import BookingService
from app.store import bookings, events
from app.store.db import connect, write
from tests.conftest import FROZEN_NOW, postgresql_only, sqlite_only

H = 3600


def utc(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp())


NOW = utc("2026-12-07 08:00")  # a Monday
A = Project(name="A", members=("alice",), classes=("online", "batch", "experiment"))
B = Project(name="B", members=("bob",), classes=("experiment",),
            allocations=(ProjectAllocation(cards=(2, 3), hours="00:00-24:00"),))
POLICY = Policy(timezone="UTC", max_booking_hours=1, max_ahead_days=1, max_cards_per_user=1)
CONFIG = Config(projects=(A, B), policy=POLICY, classes={"online": ("alice",)})
USERS = {"alice": (1001, False), "bob": (1002, False), "carol": (1003, True), "board-llama": (990, False)}
PLAIN = Config(policy=Policy(timezone="UTC"))  # no projects, no limits in the way: where a count goes is the subject
ROOMY = replace(CONFIG, policy=replace(POLICY, max_cards_per_user=8, max_booking_hours=2))  # a member holds more, longer
TTL = 600


@pytest.fixture
def fleet(fleet):
    """Idle cool cards: what runs on them now is another file's subject."""
    return replace(fleet, cards=tuple(replace(c, processes=(), temperature_c=40) for c in fleet.cards))


@pytest.fixture
def as_(make_service):
    """as_("alice", now=NOW, config=CONFIG) -> BookingService for that user."""
    return lambda user, now=NOW, config=CONFIG: make_service(user, *USERS[user], config=config, now=now)


def on_demand(service, alias: str = "qwen", *, count: int = 2, end: int = NOW + TTL, project: str = "A", **how):
    """The booking model_demand makes: the runner's, for a catalog entry, from now."""
    return service.create(count=count, start=NOW, end=end, klass="online", project=project, on_demand=alias, **how)


# -- what it is exempt from, and what it keeps -------------------------------------------------------------------------


def test_an_on_demand_booking_is_exempt_from_the_rules_about_people(as_):
    """The runner's account is not in [classes] online nor in project A, holds 2 cards (the limit is 1) for 2 h (the
    longest is 1 h): all of it is the catalog's (the admin's) to say. Nearest wrong versions: any one exemption left
    out (the same booking without on_demand is refused by each rule)."""
    runner = as_("board-llama")
    booking = on_demand(runner, end=NOW + 2 * H)
    assert (booking.user, len(booking.cards), booking.end, booking.project) == ("board-llama", 2, NOW + 2 * H, "A")
    assert (booking.request, booking.note, booking.on_demand) == ({"on_demand": "qwen"}, "on demand: qwen", "qwen")
    for refused, how in ((NotPermitted, {}), (NotPermitted, {"klass": "batch"}),
                         (NotPermitted, {"klass": "batch", "count": 1, "project": "A"})):
        with pytest.raises(refused):
            as_("board-llama").create(**{"count": 2, "start": NOW, "end": NOW + 2 * H, "klass": "online",
                                         "project": "A", **how})
    # Far ahead too (a day at most for a member): its span grows by leases, and a preload may book ahead.
    assert on_demand(as_("board-llama"), "far", count=1, end=NOW + 30 * H).end == NOW + 30 * H


def test_it_merges_into_a_request_given_and_a_member_may_not_mark_a_request_on_demand(as_):
    """Nearest wrong versions: the request given dropped, on_demand taken from a member's request (a soft booking
    anyone can make)."""
    booking = on_demand(as_("board-llama"), request={"model": "/m/q.gguf", "ctx": 4096, "parallel": 1})
    assert booking.request == {"model": "/m/q.gguf", "ctx": 4096, "parallel": 1, "on_demand": "qwen"}
    with pytest.raises(BadInput, match="on_demand is the service's to set"):
        as_("alice").create(cards=[0], start=NOW, end=NOW + H, klass="online", request={"on_demand": "qwen"})


def test_it_keeps_the_pools_windows_other_projects_allocations_and_its_budget(as_):
    """Nearest wrong versions: card_refusal dropped with the cards-at-once limit (the window, the allocation let
    through), the budget exempted with the people's rules."""
    night = Pool(name="night", cards=(0, 1), windows={"online": ClassWindow(start_minute=19 * 60, end_minute=23 * 60)})
    windowed = Config(projects=(A, B), policy=POLICY, pools=(night,))
    with pytest.raises(NotPermitted, match="class online is allowed on pool night only 19:00-23:00"):
        on_demand(as_("board-llama", config=windowed), count=1, within=[0, 1])
    with pytest.raises(NotPermitted, match="the rules allow none: project B.s allocation"):
        on_demand(as_("board-llama"), count=1, within=[2, 3])
    budgeted = Config(projects=(replace(A, gpu_hours=1), B), policy=POLICY)
    with pytest.raises(NotPermitted, match="project A's budget is 1 GPU-hours"):
        on_demand(as_("board-llama", config=budgeted), end=NOW + H)  # 2 cards for an hour: 2 GPU-hours
    assert len(on_demand(as_("board-llama", config=budgeted), count=1, end=NOW + H).cards) == 1


# -- within ------------------------------------------------------------------------------------------------------------


def test_a_count_within_some_cards_takes_its_group_from_them_alone(as_):
    """Cards 4-7 (a pool's); alice holds 5. Nearest wrong versions: within ignored (the best-connected group of the
    whole box, 0-1), within read as the cards to leave out."""
    as_("alice").create(cards=[5], start=NOW, end=NOW + H, klass="online")
    assert on_demand(as_("board-llama"), within=[4, 5, 6, 7]).cards in ((4, 6), (4, 7), (6, 7))
    assert on_demand(as_("board-llama"), "other", count=1, within=[4, 5, 6, 7]).cards in ((4,), (6,), (7,))
    with pytest.raises(Conflict):
        on_demand(as_("board-llama"), "third", within=[4, 5, 6, 7])  # one of 4-7 left free
    assert on_demand(as_("board-llama"), "third", within=[0, 1]).cards == (0, 1)


def test_a_lost_card_within_is_passed_over_and_none_free_is_a_conflict(as_, conn, fleet):
    """Card 4 fell off the bus; the pool is 4-5. Nearest wrong versions: `within` checked as named cards (the lost card
    refuses the whole booking), a card outside the box taken as a refusal."""
    lost = [replace(c, lost=c.index == 4) for c in fleet.cards]
    runner = BookingService(conn, Identity("board-llama", 990, False), CONFIG, lost, fleet.topology, lambda: NOW)
    booking, notes = runner.book(count=1, start=NOW, end=NOW + TTL, klass="online", project="A", on_demand="qwen",
                                 within=[4, 5, 99])
    assert booking.cards == (5,) and notes == ("passed over card 4 (LOST: fell off the bus)",)
    with pytest.raises(Conflict, match="^no card is free for an online booking"):
        runner.book(count=1, start=NOW, end=NOW + TTL, klass="online", project="A", on_demand="other", within=[4, 5])


# -- the lease ---------------------------------------------------------------------------------------------------------


def test_the_lease_moves_the_end_up_to_the_next_booking_less_ten_seconds_and_never_back(as_, conn):
    """alice books card 0 from 09:00; the on-demand booking holds cards 0-1 until 08:10. Nearest wrong versions: the cap
    at the next booking's start (no gap) or none at all, the end moved back by a lease that asks for less, a change
    under 5 s written, the lease audited."""
    runner = as_("board-llama")
    booking = on_demand(runner, within=[0, 1])
    alice_from = NOW + H
    as_("alice").create(cards=[0], start=alice_from, end=alice_from + H, klass="online")
    logged = events.tail(conn)
    assert runner.lease(booking.id, NOW + 1200).end == NOW + 1200
    assert runner.lease(booking.id, NOW + 600).end == NOW + 1200  # never earlier
    assert runner.lease(booking.id, NOW + 1204).end == NOW + 1200  # under 5 s: not written
    assert runner.lease(booking.id, NOW + 1205).end == NOW + 1205
    assert runner.lease(booking.id, NOW + 3 * H).end == alice_from - 10
    assert events.tail(conn) == logged
    with pytest.raises(BadInput, match="not on demand"):
        runner.lease(as_("alice").create(cards=[4], start=NOW, end=NOW + H, klass="online").id, NOW + H)
    # Ended: a lease does not bring it back.
    assert as_("board-llama", now=alice_from).lease(booking.id, alice_from + H).end == alice_from - 10


@pytest.mark.parametrize("rule", ["window", "allocation", "budget"])
def test_the_lease_stops_where_a_rule_it_keeps_would_refuse_the_span(as_, rule):
    """The 2-card on-demand booking from 08:00 to 08:10, leased to 09:00: online on cards 0-1 only until 08:30 (the
    pool's window), or project B's from 08:20 (an allocation), or project A's budget at 0.5 GPU-hours (2 cards: 08:15).
    Nearest wrong versions: the lease held to the next booking alone (the rules got round by growing the span), a
    lease refused whole where part of it is allowed, the boundary by a second."""
    pool = Pool(name="day", cards=(0, 1), windows={"online": ClassWindow(start_minute=8 * 60, end_minute=8 * 60 + 30)})
    config, until = {
        "window": (replace(CONFIG, pools=(pool,)), NOW + 1800),
        "allocation": (replace(CONFIG, projects=(A, replace(B, allocations=(ProjectAllocation(
            cards=(0, 1), hours="08:20-12:00", days="mon-sun"),)))), NOW + 1200),
        "budget": (replace(CONFIG, projects=(replace(A, gpu_hours=0.5), B)), NOW + 900),
    }[rule]
    runner = as_("board-llama", config=config)
    booking = on_demand(runner, within=[0, 1])
    assert runner.lease(booking.id, NOW + H).end == until
    assert runner.lease(booking.id, NOW + 2 * H).end == until


# -- it yields ---------------------------------------------------------------------------------------------------------


def yields(conn) -> list[dict]:
    """The on-demand-yield events, oldest first: what the audit says was cut for what."""
    return [e.details for e in reversed(events.recent(conn, 1000)) if e.action == "on-demand-yield"]


def test_a_member_naming_its_cards_two_minutes_ahead_cuts_it_to_ten_seconds_before(as_, conn):
    """The on-demand booking holds cards 0-1 until 08:10; alice names card 1 from 08:02. Nearest wrong versions: the
    member refused (the on-demand booking blocking like any other), the cut at her start (no gap for the drain to
    finish), the cut at now, the booking cancelled though it has started, the cut left out of the audit, the runner
    told (its account reads no notices), a lease afterwards growing it back over her booking."""
    runner = as_("board-llama")
    held = on_demand(runner, within=[0, 1])
    alice = as_("alice")
    hers = alice.create(cards=[1], start=NOW + 120, end=NOW + H, klass="online")
    cut = alice.get(held.id)
    assert (cut.status, cut.start, cut.end) == ("booked", NOW, NOW + 110)
    assert yields(conn) == [{"booking": held.id, "by": hers.id}]
    assert alice.told == [] and cut.notice is None
    assert runner.lease(held.id, NOW + 2 * H).end == NOW + 110


def test_one_starting_now_ends_it_now_and_one_not_started_is_cancelled(as_, conn):
    """On-demand bookings on card 0 since 07:55, on card 1 from 08:01 and on card 5 from 08:01 to 09:00 (preloads
    ahead). Nearest wrong versions: the end put 10 s in the past (the past rewritten), one that has not started cut
    to a span it never had (card 5's to 08:01-08:29:50) or left standing."""
    runner = as_("board-llama", now=NOW - 300)
    started = runner.create(count=1, start=NOW - 300, end=NOW + 300, klass="online", project="A", on_demand="qwen",
                            within=[0])
    ahead = [runner.create(count=1, start=NOW + 60, end=end, klass="online", project="A", on_demand=alias,
                           within=[card]) for alias, card, end in (("mix", 1, NOW + 600), ("five", 5, NOW + H))]
    mine = as_("alice").create(cards=[0], start=NOW, end=NOW + H, klass="online")
    assert (runner.get(started.id).status, runner.get(started.id).end) == ("booked", NOW)
    bobs = as_("bob", now=NOW + 30).create(cards=[1], start=NOW + 30, end=NOW + H)
    later = as_("alice", config=ROOMY, now=NOW + 30).create(cards=[5], start=NOW + 1800, end=NOW + H, klass="online")
    assert [runner.get(b.id).status for b in ahead] == ["cancelled", "cancelled"]
    assert yields(conn) == [{"booking": started.id, "by": mine.id}, {"booking": ahead[0].id, "by": bobs.id},
                            {"booking": ahead[1].id, "by": later.id}]


def test_a_cut_never_lengthens_what_another_cut_shortened(as_, conn):
    """Two writers on different cards of one on-demand booking (PostgreSQL: each under its own cards' locks) may cut
    it in either order: the earlier end stands. Nearest wrong version: the end written as each cut computed it (the
    later cut, committed last, giving back time that another booking took)."""
    held = on_demand(as_("board-llama"), within=[0, 1])
    with write(conn):
        bookings.cut_end(conn, held.id, NOW + 100)
    with write(conn):
        bookings.cut_end(conn, held.id, NOW + 300)
    assert bookings.get(conn, held.id).end == NOW + 100




def test_a_count_takes_a_group_free_of_on_demand_bookings_while_there_is_one(as_, conn):
    """The best-connected pair is 0-1, and the on-demand booking holds it. Nearest wrong versions: the opposite
    preference (0-1 taken, the model stopped though 2-3 were free), the on-demand booking counted as taken (refused
    once the other cards are full), the preference forgotten in a search (--or-later)."""
    runner = as_("board-llama", config=PLAIN)
    held = on_demand(runner, count=2, project="", within=[0, 1])
    alice = as_("alice", config=PLAIN)
    assert alice.create(count=2, start=NOW, end=NOW + H).cards == (2, 3)
    assert alice.create(count=2, start=NOW + 60, end=NOW + H, or_later=True).cards == (4, 5)
    assert alice.create(count=2, start=NOW, end=NOW + H).cards == (6, 7)
    assert alice.get(held.id).end == NOW + TTL and yields(conn) == []
    last = alice.create(count=2, start=NOW + 300, end=NOW + H)
    assert last.cards == (0, 1) and alice.get(held.id).end == NOW + 290
    assert yields(conn) == [{"booking": held.id, "by": last.id}]


def test_a_series_occurrence_a_move_and_an_extend_over_it_take_the_cards(as_, conn):
    """Three on-demand bookings: cards 0-1 from now, card 4 from now, card 6 from 09:00 (ahead). A series occurrence
    on card 1 from 08:02, carol moving alice's 10:00 booking on card 4 to 08:05, alice extending her 08:00-09:00 booking
    on card 6 to 09:30. Nearest wrong versions: any of the three refused by the on-demand booking (the soft check only
    in `book`), or writing over it without the cut (the overlap backstop refuses)."""
    from app.service.rules.series import SeriesService

    runner = as_("board-llama")
    pair = on_demand(runner, within=[0, 1])
    four = on_demand(runner, "four", count=1, within=[4])
    alice = as_("alice", config=ROOMY)
    later = alice.create(cards=[4], start=NOW + 2 * H, end=NOW + 3 * H, klass="online")
    six = alice.create(cards=[6], start=NOW, end=NOW + H, klass="online")
    ahead = runner.create(count=1, start=NOW + H, end=NOW + 2 * H, klass="online", project="A", on_demand="six",
                          within=[6])
    booked = SeriesService(as_("bob")).book(cards=[1], every="day", start="08:02", until="08:50", first="2026-12-07",
                                            last="2026-12-07").booked
    assert alice.get(pair.id).end == NOW + 110
    moved = as_("carol", config=ROOMY).move(later.id, NOW + 300, NOW + H)
    assert (moved.start, alice.get(four.id).end) == (NOW + 300, NOW + 290)
    assert alice.extend(six.id, NOW + H + 1800).end == NOW + H + 1800
    assert alice.get(ahead.id).status == "cancelled"
    assert yields(conn) == [{"booking": pair.id, "by": booked[0].id}, {"booking": four.id, "by": later.id},
                            {"booking": ahead.id, "by": six.id}]


def test_a_reassign_onto_its_cards_takes_them_from_now(as_, conn):
    """carol gives alice's running booking card 1, which an on-demand booking holds, at 08:01: the new piece starts now
    and the on-demand booking ends now. Nearest wrong versions: the reassign refused, the cut 10 s in the past."""
    runner = as_("board-llama")
    held = on_demand(runner, within=[0, 1])
    hers = as_("alice").create(cards=[4], start=NOW, end=NOW + H, klass="online")
    piece = as_("carol", now=NOW + 60).reassign(hers.id, cards=[1])
    assert (piece.cards, piece.start, runner.get(held.id).end) == ((1,), NOW + 60, NOW + 60)
    assert yields(conn) == [{"booking": held.id, "by": piece.id}]


def test_the_backfill_moves_a_waiting_booking_over_it(as_, conn):
    """alice waits for card 1 (bob has it 08:02-08:30); bob cancels; the on-demand booking on cards 0-1 leased to
    08:15 meanwhile. The backfill moves alice up to 08:02 and cuts it. Nearest wrong versions: the backfill's search
    seeing the on-demand booking (alice left waiting until 08:15), the cut not audited as the backfill's."""
    runner = as_("board-llama")
    bobs = as_("bob").create(cards=[1], start=NOW + 120, end=NOW + 1800)
    waiting = as_("alice").create(cards=[1], start=NOW + 120, end=NOW + H, klass="online", or_later=True)
    assert waiting.start == NOW + 1800
    held = on_demand(runner, within=[0, 1], end=NOW + 110)
    as_("bob").cancel(bobs.id)
    assert runner.lease(held.id, NOW + 900).end == NOW + 900
    [(before, after)] = as_("bob").backfill()
    assert (before.id, after.start, runner.get(held.id).end) == (waiting.id, NOW + 120, NOW + 110)
    [event] = [e for e in events.recent(conn, 100) if e.action == "on-demand-yield"]
    assert (event.actor, event.details) == ("board", {"booking": held.id, "by": waiting.id})


def test_on_demand_bookings_block_each_other_and_members_block_them(as_):
    """Nearest wrong versions: an on-demand booking planned as soft as a member's (the second model cuts the first),
    a member's booking with a request read as on demand (a model path that holds the words), refusal words that name
    an on-demand booking a member's booking would cut anyway."""
    runner = as_("board-llama")
    first = on_demand(runner, within=[0, 1])
    with pytest.raises(Conflict, match=f"booked by board-llama .*booking {first.id}"):
        on_demand(runner, "second", count=1, within=[1])
    assert on_demand(runner, "second", count=1, within=[1, 5]).cards == (5,)
    quoted = {"model": '/m/"on_demand": x.gguf', "ctx": 4096, "parallel": 1}
    mine = as_("alice").create(cards=[4], start=NOW, end=NOW + H, klass="online", request=quoted)
    assert mine.on_demand == ""
    with pytest.raises(Conflict, match=f"^no card is free .*booked by alice .*booking {mine.id}"):
        on_demand(runner, "third", count=1, within=[4])
    with pytest.raises(Conflict) as refused:
        as_("bob").create(cards=[1, 4], start=NOW, end=NOW + H)
    said = str(refused.value)
    assert said.startswith("card 4 is booked by alice until ") and "board-llama" not in said


def test_its_servers_processes_keep_no_member_off_its_cards(as_, conn, fleet):
    """The server on the on-demand booking (the runner's processes on cards 0-1) and bob's job on card 4: alice's count
    of 2 now, with every other pair full, takes 0-1. Nearest wrong versions: the runner's processes read as anyone's
    (the count refused, "passed over card 0 (board-llama's processes)"), every process let through (bob's card 4
    taken under his job)."""
    held = on_demand(as_("board-llama", config=PLAIN), project="", within=[0, 1])
    for cards in ([2, 3], [6, 7]):
        as_("carol", config=PLAIN).create(cards=cards, start=NOW, end=NOW + H)
    server = GpuProcess(pid=4242, used_mib=9000, user="board-llama", uid=990, command="llama-server")
    job = GpuProcess(pid=777, used_mib=2000, user="bob", uid=1002, command="python train.py")
    seen = [replace(c, processes=(server,) if c.index in (0, 1) else (job,) if c.index == 4 else ())
            for c in fleet.cards]
    alice = BookingService(conn, Identity("alice", 1001, False), PLAIN, seen, fleet.topology, lambda: NOW)
    booking, notes = alice.book(count=2, start=NOW, end=NOW + H)
    assert booking.cards == (0, 1) and alice.get(held.id).status == "cancelled"  # from now: it keeps nothing
    assert notes == ("passed over card 4 (bob's processes, 2.0 GiB)",)


@sqlite_only
def test_the_calendar_in_memory_answers_as_the_sql_through_a_cut_and_a_cancel(as_, conn, db_path):
    """The service keeps its bookings in memory (app.store.bookings.Calendar): after each write here, each read with
    each `on_demand` answers as the SQL on a connection without one. Nearest wrong versions: the calendar's set of
    on-demand bookings not emptied by a cancel or a reload, `on_demand=False` read as all, the cut not marked for
    reading again."""
    calendar = bookings.keep_calendar(conn, NOW - 86400)
    plain = connect(db_path)
    uuids = [c.uuid for c in as_("alice").cards.values()]

    def same() -> None:
        for which in (None, False, True):
            for reader in (lambda c: bookings.busy_by_card(c, NOW, None, on_demand=which),
                           lambda c: bookings.live_between(c, NOW, NOW + 2 * H, on_demand=which),
                           lambda c: bookings.live_between(c, NOW, NOW + 2 * H, user="board-llama", on_demand=which),
                           lambda c: bookings.overlapping(c, uuids, NOW, NOW + 2 * H, on_demand=which)):
                assert reader(conn) == reader(plain)

    runner = as_("board-llama")
    held = on_demand(runner, within=[0, 1])
    ahead = runner.create(count=1, start=NOW + 60, end=NOW + 600, klass="online", project="A", on_demand="mix",
                          within=[4])
    as_("alice", config=ROOMY).create(cards=[5], start=NOW, end=NOW + H, klass="online")
    same()
    assert calendar.on_demand == {held.id, ahead.id}
    as_("alice", config=ROOMY).create(cards=[1], start=NOW + 120, end=NOW + H, klass="online")
    same()
    as_("bob", now=NOW + 30).create(cards=[4], start=NOW + 30, end=NOW + H)
    same()
    assert calendar.on_demand == {held.id}
    plain.close()


@postgresql_only
def test_on_postgresql_a_booking_on_another_card_cuts_it_while_one_on_its_first_card_is_open(store, conn, fleet,
                                                                                            make_service, monkeypatch):
    """The on-demand booking holds cards 0-1 for 2 h. Alice's booking of card 0 from +1 h is parked inside its write,
    card 0's lock taken; Bob books card 1 from +30 min meanwhile, under card 1's lock alone, cutting it, and commits;
    then Alice's goes on and finds nothing more to cut. Nearest wrong versions: a booking over an on-demand one taking
    the store's lock (Bob waits for Alice: the lock's timeout), Alice's write cutting again (a second yield event),
    the chain broken."""
    from app.store import pg as pg_module
    from tests.unit.test_pg_store import Parked, _rules

    monkeypatch.setattr(pg_module, "LOCK_TIMEOUT_MS", 2000)  # a wrong version's wait: a refusal, not a hang
    now = FROZEN_NOW
    held = make_service("board-llama", 990, config=PLAIN, now=now).create(
        count=2, start=now, end=now + 2 * H, klass="online", on_demand="qwen", within=[0, 1])
    alice = Parked(store, fleet, "alice", 1001)  # books +1 h to +2 h
    thread = alice.book([0])
    bob = _rules(store, fleet, "bob", 1002)
    bobs = bob.create(cards=[1], start=now + 1800, end=now + H)
    assert alice.outcome.empty() and bob.get(held.id).end == now + 1790
    alice.go.set()
    thread.join(60)
    assert alice.outcome.get_nowait().cards == (0,)
    assert bob.get(held.id).end == now + 1790 and yields(conn) == [{"booking": held.id, "by": bobs.id}]
    assert events.first_broken(conn) is None
    for other in (alice.conn, bob.conn):
        other.close()
