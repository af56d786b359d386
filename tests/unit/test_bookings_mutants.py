"""The booking rules at edges `make mutation` found untold apart: whose limit a search counts, and where it stops."""

from __future__ import annotations

import pytest

from app.config import Config, Policy
from app.errors import Conflict
from app.store import bookings as rows
from tests.conftest import FROZEN_NOW, sqlite_only, worded

H = 3600
NOW = FROZEN_NOW


@pytest.fixture
def fleet(fleet):
    """The default fleet, idle and cool: these are the calendar's rules."""
    from dataclasses import replace

    return replace(fleet, cards=tuple(replace(c, processes=(), temperature_c=40) for c in fleet.cards))


class TestEarliestUnderAnotherUsersLimit:
    """An admin's search for a holder (op earliest with `user`) counts the holder's cards, not the admin's."""

    def test_the_holders_cards_push_the_start_past_their_booking(self, make_service):
        one_card = Config(policy=Policy(max_cards_per_user=1))
        make_service(config=one_card).create(cards=[0], start=NOW, end=NOW + H)
        admin = make_service("root", 0, admin=True, config=one_card)
        search = {"cards": [3], "start": NOW, "duration": H}  # no class: an experiment
        # alice holds card 0 until 16:30: a second card for her fits only from then; root holds nothing.
        assert worded(admin.earliest_words({**search, "user": "alice"})) == "next free start for cards 3: 16:30 (in 60 min)"
        assert worded(admin.earliest_words(search)) == "next free start for cards 3: 15:30 (now)"


class TestBackfillOnTwoHosts:
    """Each host's service moves only its own host's queue (the fleet: one database, a service per host)."""

    def test_a_queued_booking_on_another_host_is_left_to_it_and_the_rest_still_move(self, conn, fleet):
        from dataclasses import replace

        from app.core.identity import Identity
        from app.service.bookings import BookingService

        other = replace(fleet, cards=tuple(replace(c, uuid=f"B-{c.uuid}") for c in fleet.cards))

        def on(host, source, name, uid):
            return BookingService(conn, Identity(name, uid, False), Config(), source.cards, source.topology,
                                  lambda: NOW, host=host)

        # Host b: alice's online booking, first in the queue, waits behind bob's.
        bob = on("b", other, "bob", 1002).create(count=8, start=NOW, end=NOW + 2 * H)
        theirs = on("b", other, "alice", 1001).create(count=2, start=NOW, end=NOW + H, klass="online", or_later=True)
        # Host a: dave's experiment waits behind carol's on cards 0,1; once carol cancels, erin holds 0,1.
        carol = on("a", fleet, "carol", 1003).create(count=8, start=NOW, end=NOW + 2 * H)
        mine = on("a", fleet, "dave", 1004).create(count=2, start=NOW, end=NOW + H, or_later=True)
        assert (theirs.start, theirs.queued, mine.start, mine.cards) == (NOW + 2 * H, "cards", NOW + 2 * H, (0, 1))
        on("b", other, "bob", 1002).cancel(bob.id)
        on("a", fleet, "carol", 1003).cancel(carol.id)
        on("a", fleet, "erin", 1005).create(cards=[0, 1], start=NOW, end=NOW + H)

        moved = on("a", fleet, "root", 0).backfill()
        assert [(before.id, after.start, after.cards, after.host) for before, after in moved] == [
            (mine.id, NOW, (2, 3), "a")]
        assert rows.get(conn, theirs.id).start == NOW + 2 * H  # host b's service moves it, not a's
        hosts = dict(conn.execute("SELECT uuid, host FROM cards"))
        assert {hosts[c.uuid] for c in fleet.cards} == {"a"} and {hosts[c.uuid] for c in other.cards} == {"b"}


class TestExtendEdges:
    def test_an_end_at_or_before_the_current_end_is_bad_input_and_writes_nothing(self, make_service, conn):
        from app.errors import BadInput
        from app.store import events

        service = make_service()
        booking = service.create(cards=[0], start=NOW, end=NOW + 2 * H)
        before = events.recent(conn, 100)
        for end in (NOW + 2 * H, NOW + H):
            with pytest.raises(BadInput) as refused:
                service.extend(booking.id, end)
            assert worded(refused.value) == "the new end must be after the current end 17:30 (in 2 h)"
        assert events.recent(conn, 100) == before and service.get(booking.id).end == NOW + 2 * H
        assert service.extend(booking.id, NOW + 2 * H + 1).end == NOW + 2 * H + 1


class TestEarliestWordsInput:
    """op earliest hands a client's search to earliest_words: a search for neither cards nor a group is bad input."""

    @pytest.mark.parametrize("count", [None, 3])
    def test_a_search_for_no_group_is_refused_by_name(self, make_service, count):
        from app.errors import BadInput

        with pytest.raises(BadInput) as refused:
            make_service().earliest_words({"count": count, "start": NOW, "duration": H})
        assert str(refused.value) == f"a group is 1, 2, 4 or 8 cards, not {count}"


@sqlite_only  # the calendar in memory is SQLite's (app.store.bookings.Calendar)
def test_a_refusal_after_its_change_wrote_leaves_the_calendar_as_the_database(conn, make_service):
    """audited's contract for any change, even one that writes before it refuses: the write is rolled back, and the
    connection's calendar, which read the write first, reads it again."""
    rows.keep_calendar(conn, NOW - 24 * H)
    rules = make_service()
    booking = rules.create(cards=[0], start=NOW + H, end=NOW + 2 * H)

    def ends() -> list[int]:
        return [b.end for b in rows.live_between(conn, booking.start, booking.end + H)]

    def change(now: int) -> int:
        rows.set_times(conn, booking.id, booking.start, booking.end + H)
        assert ends() == [booking.end + H]
        raise Conflict("refused after writing")

    with pytest.raises(Conflict, match="refused after writing"):
        rules.audited("extend", {}, change)
    assert ends() == [booking.end]
