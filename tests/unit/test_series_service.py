"""Series rules on a frozen clock and a real SQLite file (app.service.rules.series): policy zone, pools, overrides,
who may act, and what a cancel keeps. The same behaviour over both transports is in tests/service/test_series.py."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

from app.config import ClassWindow, Config, Policy, Pool
from app.errors import BadInput, Conflict, NotPermitted
from app.service.rules.series import SeriesService
from app.store import bookings as rows
from app.store import events
from app.store import series as store
from app.store.db import write
from app.core.text import localize
from tests.conftest import FROZEN_NOW, sqlite_only  # Sunday 2026-11-29 15:30 UTC

BERLIN = ZoneInfo("Europe/Berlin")
HOUR = 3600
# The seeds' plan: prod takes online, batch and finetune, finetune only at night and at weekends; lab anything.
PROD = Pool("prod", (0, 1, 2, 3), ("online", "batch", "finetune"), windows={"finetune": ClassWindow(19 * 60, 9 * 60)})
LAB = Pool("lab", (4, 5, 6, 7), max_hours=12)
SEEDS = Config(policy=Policy(timezone="Europe/Berlin", max_ahead_days=400), pools=(PROD, LAB))


@pytest.fixture
def series(make_service):
    """series(name=..., uid=..., admin=..., config=SEEDS, now=FROZEN_NOW) -> SeriesService."""

    def make(name="alice", uid=1001, admin=False, config=SEEDS, now=FROZEN_NOW):
        return SeriesService(make_service(name=name, uid=uid, admin=admin, config=config, now=now))

    return make


def berlin(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, BERLIN).strftime("%a %Y-%m-%d %H:%M")


def worded(said, zone=BERLIN) -> str:
    """A refusal as a member in `zone` (default Berlin, the seeds' policy zone) reads it: its times in their zone."""
    return localize(str(said), zone)


def written(conn) -> tuple[int, int, int]:
    return (conn.execute("SELECT count(*) FROM bookings").fetchone()[0],
            conn.execute("SELECT count(*) FROM series").fetchone()[0],
            conn.execute("SELECT count(*) FROM events").fetchone()[0])


def test_the_seeds_standing_arrangement_books_in_the_policy_zone(series, conn):
    """prod cards 0-3 online every weekday 09:00-19:00, and finetune on them at night: both fit, side by side."""
    day = series().book(cards=[0, 1, 2, 3], klass="online", every="weekday", start="9:00", until="19:00",
                        first="2026-12-07", last="2026-12-18", note="prod TP4")
    night = series().book(cards=[0, 1, 2, 3], klass="finetune", every="weekday", start="19:00", until="7:00",
                          first="2026-12-07", last="2026-12-18", note="nightly finetune")
    assert len(day.booked) == len(night.booked) == 10
    assert [berlin(b.start)[-5:] + "-" + berlin(b.end)[-5:] for b in day.booked] == ["09:00-19:00"] * 10
    assert berlin(night.booked[4].start) == "Fri 2026-12-11 19:00" and berlin(night.booked[4].end) == "Sat 2026-12-12 07:00"
    assert {b.series_id for b in day.booked} == {day.series.id} != {b.series_id for b in night.booked}
    assert {(b.cards, b.klass, b.note, b.user) for b in day.booked} == {((0, 1, 2, 3), "online", "prod TP4", "alice")}
    assert day.series.rule == {"every": "weekday", "days": [0, 1, 2, 3, 4], "start": "09:00", "until": "19:00",
                               "from": "2026-12-07", "to": "2026-12-18", "cards": [0, 1, 2, 3], "class": "online",
                               "note": "prod TP4", "zone": "Europe/Berlin"}
    stored, found = series().get(day.series.id)
    assert stored == day.series and found == day.booked
    created = [e for e in events.recent(conn, 1000) if e.action == "create"]
    assert len(created) == 20 and {e.details["series_id"] for e in created} == {day.series.id, night.series.id}


def test_the_wall_clock_holds_across_dst_in_the_policy_zone_not_the_callers(series, monkeypatch):
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # the service reads [policy] timezone, whatever its own TZ
    time.tzset()
    try:
        made = series().book(cards=[4], every="day", start="9:00", until="10:00", first="2027-03-27",
                             last="2027-03-29")
    finally:
        monkeypatch.undo()
        time.tzset()
    assert [berlin(b.start)[-5:] for b in made.booked] == ["09:00"] * 3
    assert [datetime.fromtimestamp(b.start, timezone.utc).hour for b in made.booked] == [8, 7, 7]


def test_policy_refusals_name_the_rule_and_book_nothing(series, conn):
    before = written(conn)
    with pytest.raises(NotPermitted) as refused:
        series().book(cards=[0, 1], klass="finetune", every="weekday", start="8:00", until="18:00",
                      first="2026-12-07", last="2026-12-11")
    message = worded(refused.value)
    assert message.startswith("the policy refuses 5 of 5 occurrences, so nothing was booked: card 0: class finetune"
                              " is allowed on pool prod only 19:00-09:00 (Europe/Berlin) and at weekends (5 occurrences,"
                              " Mon 2026-12-07 08:00 to Fri 2026-12-11 08:00)")
    assert message.endswith("admins may pass --override-policy") and refused.value.exit_code == 4
    bookings, series_rows, audit = written(conn)
    assert (bookings, series_rows, audit) == (before[0], before[1], before[2] + 1)  # only the refusal's audit row
    (event,) = events.recent(conn, 1)
    assert (event.action, event.ok, event.booking_id) == ("series", False, None) and "refused" in event.details
    assert event.details["refused_by"] == "policy"  # counted by /metrics as board_bookings_refused_total{reason="policy"}


@pytest.mark.parametrize("taken", [1, 2])
def test_a_refusal_also_lists_the_conflicts_with_their_holder(series, make_service, conn, taken):
    """Finetune at 08:00 on prod breaks its window on Friday; at the weekend it may run, but bob holds card 0."""
    bob = make_service(name="bob", uid=1002, config=SEEDS)
    for day in range(taken):
        start = int(datetime(2026, 12, 12 + day, 8, tzinfo=BERLIN).timestamp())  # Saturday, then Sunday
        bob.create(cards=[0], start=start, end=start + HOUR, klass="batch")
    before = written(conn)
    with pytest.raises(NotPermitted) as refused:
        series().book(cards=[0, 1], klass="finetune", every="day", start="8:00", until="18:00",
                      first="2026-12-11", last="2026-12-13")
    message = worded(refused.value)
    assert message.startswith("the policy refuses 1 of 3 occurrences, so nothing was booked: card 0: class finetune")
    also = f"; also {taken} {'conflict' if taken == 1 else 'conflicts'}: "
    assert also in message and message.count("bob") == taken, message
    assert message.endswith("admins may pass --override-policy")
    assert written(conn)[:2] == before[:2]


def test_occurrences_past_max_ahead_are_refused_with_a_way_forward(series):
    short = Config(policy=Policy(timezone="Europe/Berlin", max_ahead_days=14))
    with pytest.raises(NotPermitted) as refused:
        series(config=short).book(cards=[5], every="day", start="9:00", until="17:00", first="2026-12-07",
                                  last="2026-12-20")
    assert "a booking may start at most 14 days ahead (7 occurrences, Mon 2026-12-14 09:00 to Sun 2026-12-20 09:00)" \
        in worded(refused.value)
    assert "book up to --to 2026-12-13 now and add the rest later with 'board series extend'" in worded(refused.value)


def test_the_way_forward_is_offered_only_when_every_refusal_comes_after_the_last_free_day(series):
    """'book up to --to' the last free day, when the refusals all come after it (Monday refused, the weekend before
    it free); none when a refusal comes before a free day (Friday too): booking up to Sunday would still be refused.
    Wrong versions: the last refusal compared in place of the first (offers it for Friday-to-Monday); the first free
    day named in place of the last."""
    ask = dict(cards=[0], klass="finetune", every="day", start="10:00", until="12:00")  # weekdays outside the window
    with pytest.raises(NotPermitted) as refused:
        series().book(**ask, first="2026-12-05", last="2026-12-07")  # Sat, Sun free; Mon refused
    assert worded(refused.value).endswith(
        "(Mon 2026-12-07 10:00); book up to --to 2026-12-06 now and add the rest later with 'board series extend';"
        " admins may pass --override-policy")
    with pytest.raises(NotPermitted) as refused:
        series().book(**ask, first="2026-12-04", last="2026-12-07")  # Fri and Mon refused, Sat and Sun free
    assert worded(refused.value).endswith(
        "(2 occurrences, Fri 2026-12-04 10:00 to Mon 2026-12-07 10:00); admins may pass --override-policy")


def test_only_admins_override_the_policy_and_each_override_is_audited(series, conn):
    ask = dict(cards=[0], klass="finetune", every="day", start="10:00", until="12:00", first="2026-12-05",
               last="2026-12-07")  # Sat, Sun (weekends: allowed) and Mon (refused: the night window)
    with pytest.raises(NotPermitted) as refused:
        series().book(**ask, override_policy=True)
    assert worded(refused.value) == "only admins (group board-admin) can pass --override-policy"
    made = series(name="root", uid=0, admin=True).book(**ask, override_policy=True)
    assert len(made.booked) == 3 and [berlin(m.start) for m in made.overridden] == ["Mon 2026-12-07 10:00"]
    assert [(berlin(m.end), m.reason) for m in made.overridden] == [
        ("Mon 2026-12-07 12:00",
         "card 0: class finetune is allowed on pool prod only 19:00-09:00 (Europe/Berlin) and at weekends")]
    audit = {e.booking_id: e.details for e in events.recent(conn, 100) if e.action == "create"}
    assert [audit[b.id].get("override_policy") for b in made.booked] == [
        None, None, "card 0: class finetune is allowed on pool prod only 19:00-09:00 (Europe/Berlin) and at weekends"]
    (event,) = [e for e in events.recent(conn, 100) if e.action == "series" and e.ok]
    assert event.details["override_policy"] is True and len(event.details["overridden"]) == 1


def test_an_override_never_books_over_someone(series, make_service, conn):
    make_service(name="bob", uid=1002).create(cards=[0], start=FROZEN_NOW + 8 * 24 * HOUR, end=FROZEN_NOW + 9 * 24 * HOUR)
    with pytest.raises(Conflict) as refused:
        series(name="root", uid=0, admin=True).book(cards=[0], klass="finetune", every="day", start="10:00",
                                                    until="12:00", first="2026-12-07", last="2026-12-08",
                                                    override_policy=True)
    assert "card 0 is booked by bob" in worded(refused.value)
    assert events.recent(conn, 1)[0].details["refused_by"] == "conflict"


def test_cancel_keeps_the_past_and_the_running_occurrence(series, conn):
    clock = [FROZEN_NOW]
    made = series(now=lambda: clock[0]).book(cards=[6], every="day", start="9:00", until="17:00",
                                             first="2026-12-07", last="2026-12-10")
    first, second, *rest = made.booked
    clock[0] = second.start + HOUR  # Tuesday 10:00: Monday's is history, Tuesday's runs
    kept, cancelled, running = series(now=lambda: clock[0]).cancel(made.series.id)
    assert [b.id for b in cancelled] == [b.id for b in rest] and [b.id for b in running] == [second.id]
    statuses = {b.id: b.status for b in rows.listing(conn, start=None, end=None, user=None, include_cancelled=True)}
    assert statuses == {first.id: "booked", second.id: "booked", **{b.id: "cancelled" for b in rest}}
    assert kept.rule["cancelled_at"] == clock[0]
    with pytest.raises(BadInput, match="already cancelled"):
        series(now=lambda: clock[0]).cancel(made.series.id)
    with pytest.raises(BadInput, match="was cancelled; book a new one"):
        series(now=lambda: clock[0]).extend(made.series.id, "2026-12-20")


def test_only_the_holder_or_an_admin_changes_a_series(series, conn):
    made = series().book(cards=[7], every="day", start="9:00", until="10:00", first="2026-12-07", last="2026-12-08")
    for act in (lambda s: s.cancel(made.series.id), lambda s: s.extend(made.series.id, "2026-12-09")):
        with pytest.raises(NotPermitted, match="series .* belongs to alice; only they or an admin"):
            act(series(name="bob", uid=1002))
    assert [e.ok for e in events.recent(conn, 2)] == [False, False]  # both refusals audited
    extended = series(name="root", uid=0, admin=True).extend(made.series.id, "2026-12-09")
    assert [(b.user, b.uid) for b in extended.booked] == [("alice", 1001)]  # the holder's, not the admin's
    (event,) = [e for e in events.recent(conn, 10) if e.action == "create" and e.booking_id == extended.booked[0].id]
    assert (event.actor, event.uid) == ("root", 0)


def test_extend_is_all_or_nothing_and_keeps_the_rule_on_refusal(series, make_service, conn):
    made = series().book(cards=[3], klass="online", every="weekday", start="9:00", until="19:00",
                         first="2026-12-07", last="2026-12-11")
    holder = make_service(name="bob", uid=1002).create(cards=[3], start=made.booked[-1].start + 3 * 24 * HOUR + HOUR,
                                                        end=made.booked[-1].start + 3 * 24 * HOUR + 2 * HOUR)
    with pytest.raises(Conflict) as refused:
        series().extend(made.series.id, "2026-12-18")
    assert f"(booking {holder.id})" in worded(refused.value) and "Mon 2026-12-14 09:00" in worded(refused.value)
    assert series().get(made.series.id)[0].rule["to"] == "2026-12-11" and len(series().get(made.series.id)[1]) == 5
    grown = series().extend(made.series.id, "2026-12-18", skip_conflicts=True)
    assert len(grown.booked) == 4 and [berlin(m.start) for m in grown.skipped] == ["Mon 2026-12-14 09:00"]
    assert [berlin(m.end) for m in grown.skipped] == ["Mon 2026-12-14 19:00"] and "bob" in grown.skipped[0].reason
    assert grown.series.rule["to"] == "2026-12-18" and {b.series_id for b in grown.booked} == {made.series.id}
    with pytest.raises(BadInput, match="--to 2026-12-18 is not after the series' last day 2026-12-18"):
        series().extend(made.series.id, "2026-12-18")


@pytest.mark.parametrize(
    "ask, message",
    [
        (dict(every="daily-ish"), "can't read --every"),
        (dict(last="2026-12-01"), "--to 2026-12-01 is before --from 2026-12-07"),
        (dict(every="weekend", last="2026-12-11"), "no occurrences: every weekend"),
        (dict(first="2026-11-20"), "--from 2026-11-20 is in the past"),
        (dict(last="2026-12-32"), "can't read --to '2026-12-32' as a date"),
        (dict(cards=[9]), "unknown card 9"),
        (dict(klass="urgent"), "unknown class 'urgent'"),
        (dict(note="x" * 501), "the note is 501 characters"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(series, conn, ask, message):
    before = written(conn)
    args = dict(cards=[4], every="weekday", start="9:00", until="19:00", first="2026-12-07", last="2026-12-18") | ask
    with pytest.raises(BadInput) as refused:
        series().book(**args)
    assert message in worded(refused.value) and "\n" not in worded(refused.value)
    assert written(conn) == before


def test_today_starts_with_the_next_occurrence_still_ahead(series):
    # Sunday 15:30 UTC is 16:30 in Berlin: today's 09:00 has passed, so the series starts on Monday.
    made = series().book(cards=[4], every="day", start="9:00", until="10:00", last="2026-12-01")
    assert [berlin(b.start) for b in made.booked] == ["Mon 2026-11-30 09:00", "Tue 2026-12-01 09:00"]
    assert made.series.rule["from"] == "2026-11-29"


def test_an_admins_extension_counts_the_holders_bookings_against_the_holders_limit(series, make_service):
    one = Config(policy=Policy(timezone="UTC", max_cards_per_user=1))
    made = series(config=one).book(cards=[3], every="day", start="9:00", until="10:00", first="2026-12-07",
                                   last="2026-12-08")
    nine = int(datetime(2026, 12, 9, 9, 0, tzinfo=timezone.utc).timestamp())
    make_service(config=one).create(cards=[0], start=nine, end=nine + HOUR)
    with pytest.raises(NotPermitted) as refused:
        series(name="root", uid=0, admin=True, config=one).extend(made.series.id, "2026-12-09")
    assert worded(refused.value, timezone.utc) == (
        "the policy refuses the occurrence, so nothing was booked: you would hold 2 cards at once; the limit is 1"
        " (Wed 2026-12-09 09:00); admins may pass --override-policy")


def test_each_series_change_is_audited_with_what_it_did(series, conn):
    made = series().book(cards=[7], every="day", start="9:00", until="10:00", first="2026-12-07", last="2026-12-08",
                         note="standup")
    ids = [b.id for b in made.booked]
    (event,) = [e for e in events.recent(conn, 10) if e.action == "series"]
    assert (event.booking_id, event.ok, event.actor) == (None, True, "alice")
    assert event.details == {
        "rule": {"every": "day", "days": [0, 1, 2, 3, 4, 5, 6], "start": "09:00", "until": "10:00", "from": "2026-12-07",
                 "to": "2026-12-08", "cards": [7], "class": "experiment", "note": "standup", "zone": "Europe/Berlin"},
        "skip_conflicts": False, "override_policy": False, "series_id": made.series.id, "bookings": ids,
        "skipped": [], "overridden": []}
    grown = series().extend(made.series.id, "2026-12-09")
    assert grown.booked[0].note == "standup"
    (event,) = [e for e in events.recent(conn, 10) if e.action == "series_extend"]
    assert event.details == {"series_id": made.series.id, "to": "2026-12-09", "skip_conflicts": False,
                             "override_policy": False, "old_to": "2026-12-08", "bookings": [grown.booked[0].id],
                             "skipped": [], "overridden": []}
    series().cancel(made.series.id)
    (event,) = [e for e in events.recent(conn, 10) if e.action == "series_cancel"]
    assert event.details == {"series_id": made.series.id, "cancelled": [*ids, grown.booked[0].id], "running": []}
    cancels = sorted((e.booking_id, e.ok, e.details) for e in events.recent(conn, 20) if e.action == "cancel")
    assert cancels == [(i, True, {"series_id": made.series.id}) for i in [*ids, grown.booked[0].id]]


@pytest.mark.parametrize("verb", ["cancel", "extend"])
def test_someone_elses_series_names_its_holder_and_the_verb(series, verb):
    made = series().book(cards=[7], every="day", start="9:00", until="10:00", first="2026-12-07", last="2026-12-08")
    bob = series(name="bob", uid=1002)
    with pytest.raises(NotPermitted) as refused:
        bob.cancel(made.series.id) if verb == "cancel" else bob.extend(made.series.id, "2026-12-09")
    assert str(refused.value) == f"series {made.series.id} belongs to alice; only they or an admin can {verb} it"


def test_a_series_with_only_its_running_occurrence_left_says_how_to_end_it(series):
    clock = [FROZEN_NOW]
    made = series(now=lambda: clock[0]).book(cards=[6], every="day", start="9:00", until="17:00",
                                             first="2026-12-07", last="2026-12-07")
    clock[0] = made.booked[0].start  # it starts this very second
    with pytest.raises(BadInput) as refused:
        series(now=lambda: clock[0]).cancel(made.series.id)
    booking = made.booked[0].id
    assert str(refused.value) == (f"series {made.series.id} has no occurrences ahead to cancel; booking {booking} is"
                                  f" running: 'board release {booking}' ends it")
    clock[0] = made.booked[0].end  # over: nothing runs
    with pytest.raises(BadInput) as refused:
        series(now=lambda: clock[0]).cancel(made.series.id)
    assert worded(refused.value) == f"series {made.series.id} has no occurrences ahead to cancel"


@pytest.mark.parametrize("ask, message", [
    (dict(first="7 Dec"), "can't read --from '7 Dec' as a date; give a day such as 2026-12-07"),
    (dict(last="soon"), "can't read --to 'soon' as a date; give a day such as 2026-12-07"),
])
def test_unreadable_dates_name_the_option(series, ask, message):
    with pytest.raises(BadInput) as refused:
        series().book(**{**dict(cards=[7], every="day", start="9:00", until="10:00", last="2026-12-08"), **ask})
    assert worded(refused.value) == message


def test_an_unreadable_new_last_day_names_the_option(series):
    made = series().book(cards=[7], every="day", start="9:00", until="10:00", first="2026-12-07", last="2026-12-08")
    with pytest.raises(BadInput) as refused:
        series().extend(made.series.id, "next week")
    assert worded(refused.value) == "can't read --to 'next week' as a date; give a day such as 2026-12-07"


def test_conflicts_are_listed_with_when_and_who_and_what_to_do(series, make_service, monkeypatch):
    monkeypatch.setenv("TZ", "UTC")  # the reader's zone
    time.tzset()
    try:
        one = Config(policy=Policy(timezone="UTC"))

        def said(error) -> str:
            return worded(error, timezone.utc)

        bob = make_service(name="bob", uid=1002, config=one)
        day = int(datetime(2026, 12, 7, 9, 0, tzinfo=timezone.utc).timestamp())
        taken = bob.create(cards=[7], start=day, end=day + HOUR)
        ask = dict(cards=[7], every="day", start="9:00", until="10:00", first="2026-12-07")
        holder = f"card 7 is booked by bob from 2026-12-07 09:00 (in 8 days) to 2026-12-07 10:00 (booking {taken.id})"
        with pytest.raises(Conflict) as refused:
            series(config=one).book(**ask, last="2026-12-09")
        assert said(refused.value) == (f"1 of 3 occurrences conflicts, so nothing was booked: Mon 2026-12-07 09:00: {holder};"
                                      " pass --skip-conflicts to book the other 2")
        with pytest.raises(Conflict) as refused:
            series(config=one).book(**ask, last="2026-12-07")
        assert said(refused.value) == f"the occurrence conflicts, so nothing was booked: Mon 2026-12-07 09:00: {holder}"
        for offset in range(1, 12):  # twelve days taken: ten are named, the rest counted
            bob.create(cards=[7], start=day + offset * 86400, end=day + offset * 86400 + HOUR)
        with pytest.raises(Conflict) as refused:
            series(config=one).book(**ask, last="2026-12-18")
        assert said(refused.value).startswith("12 of 12 occurrences conflict, so nothing was booked: Mon 2026-12-07 09:00: ")
        assert said(refused.value).count(": card 7 is booked by bob") == 10 and said(refused.value).endswith("; and 2 more")
        with pytest.raises(Conflict) as refused:
            series(config=one).book(**ask, last="2026-12-18", skip_conflicts=True)
        assert said(refused.value).startswith("all 12 occurrences conflict, so nothing was booked: Mon 2026-12-07 09:00: card 7")
    finally:
        monkeypatch.undo()
        time.tzset()


def test_each_booking_a_series_makes_has_its_own_create_event(series, conn):
    made = series().book(cards=[7], every="day", start="9:00", until="10:00", first="2026-12-07", last="2026-12-07",
                         klass="batch", note="nightly")
    (booking,) = made.booked
    (event,) = [e for e in events.recent(conn, 10) if e.action == "create"]
    assert (event.booking_id, event.ok) == (booking.id, True)
    assert event.details == {"cards": [7], "start": booking.start, "end": booking.end, "class": "batch", "note": "nightly",
                             "series_id": made.series.id}


def test_today_is_the_policy_zones_day(series, monkeypatch):
    tokyo = Config(policy=Policy(timezone="Asia/Tokyo"))  # Monday 00:30 there, still Sunday in UTC
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        with pytest.raises(BadInput) as refused:
            series(config=tokyo).book(cards=[7], every="day", start="9:00", until="10:00", first="2026-11-29",
                                      last="2026-11-30")
        assert worded(refused.value) == "--from 2026-11-29 is in the past; a series starts today (2026-11-30) at the earliest"
    finally:
        monkeypatch.undo()
        time.tzset()


@sqlite_only  # edits with SQLite's json_set
def test_an_unknown_or_hand_broken_series_is_one_line_bad_input(series, conn):
    with pytest.raises(BadInput) as refused:
        series().get(999)
    assert worded(refused.value) == "no series 999; 'board list' shows each booking's series"
    made = series().book(cards=[7], every="day", start="9:00", until="10:00", first="2026-12-07", last="2026-12-08")
    with write(conn):
        conn.execute("UPDATE series SET rule = json_set(rule, '$.days', json('[9]')) WHERE id = ?", (made.series.id,))
    with pytest.raises(BadInput) as refused:
        series().extend(made.series.id, "2026-12-09")
    assert str(refused.value) == (f"series {made.series.id} has a malformed rule (days (9,) are not weekdays 0-6);"
                                  " cancel it and book anew")


def test_an_extension_spans_at_most_a_year_at_a_time(series):
    made = series().book(cards=[7], every="week", start="9:00", until="10:00", first="2026-12-07", last="2026-12-07")
    with pytest.raises(BadInput) as refused:
        series().extend(made.series.id, "2027-12-10")
    assert worded(refused.value) == "2026-12-08 to 2027-12-10 is 367 days; extend a series by at most 366 days at a time"
    assert series().extend(made.series.id, "2027-12-09").series.rule["to"] == "2027-12-09"  # exactly 366 days


@pytest.mark.parametrize("days", [2, 10, 11])
def test_conflicts_are_counted_and_listed_up_to_ten(series, make_service, days):
    """bob holds card 5 at 09:00 on the first day (two days asked) or on every day (ten are listed, the rest counted)."""
    bob = make_service(name="bob", uid=1002, config=SEEDS)
    for day in range(1 if days == 2 else days):
        start = int(datetime(2026, 12, 7 + day, 9, tzinfo=BERLIN).timestamp())
        bob.create(cards=[5], start=start, end=start + HOUR)
    with pytest.raises(Conflict) as refused:
        series().book(cards=[5], every="day", start="9:00", until="10:00", first="2026-12-07",
                      last=f"2026-12-{6 + days:02d}")
    message = worded(refused.value)
    if days == 2:
        assert message.startswith("1 of 2 occurrences conflicts, so nothing was booked: Mon 2026-12-07 09:00: card 5 is"
                                  " booked by bob from ")
        assert message.endswith("; pass --skip-conflicts to book the other 1")
    else:
        assert message.startswith(f"{days} of {days} occurrences conflict, so nothing was booked: ")
        assert message.count("booked by bob") == 10
        assert message.endswith("; and 1 more") == (days == 11) and "and 0 more" not in message


# -- issue 19: setups that tell the right answer from a nearly right one (app.service.rules.series' mutants) ----------

@pytest.fixture
def utc_reader(set_tz):
    """This process (the reader) in UTC, so that a date read in its zone rather than the policy zone shows."""
    set_tz("UTC")


def test_an_occurrence_starting_this_very_second_is_still_ahead(series):
    nine = int(datetime(2026, 12, 7, 9, tzinfo=BERLIN).timestamp())
    made = series(now=nine).book(cards=[7], every="day", start="9:00", until="10:00", last="2026-12-08")
    assert [b.start for b in made.booked] == [nine, nine + 24 * HOUR]
    assert {(b.klass, b.note) for b in made.booked} == {("experiment", "")}  # the defaults
    with pytest.raises(BadInput) as refused:  # a second later it has started: nothing is left ahead
        series(now=nine + 1).book(cards=[7], every="day", start="9:00", until="10:00", last="2026-12-07")
    assert worded(refused.value) == ("no occurrences: every day 09:00-10:00, 2026-12-07 to 2026-12-07 has no day"
                                     " ahead to book; check --every and the dates")


def test_a_refusal_in_full_groups_by_rule_lists_conflicts_and_says_up_to_when_in_the_policy_zone(
        series, make_service, utc_reader):
    """Nightly 00:30 in Berlin is 23:30 the day before in UTC. Alice's series on card 5 meets bob on two nights,
    her own booking on card 6 (the limit is one card at once) on the 13th, and the 14-day horizon from the 14th."""
    night = Config(policy=Policy(timezone="Europe/Berlin", max_ahead_days=14, max_cards_per_user=1))

    def at(day: int) -> int:
        return int(datetime(2026, 12, day, 0, 30, tzinfo=BERLIN).timestamp())

    bob = make_service(name="bob", uid=1002, config=night)
    taken = [bob.create(cards=[5], start=at(day), end=at(day) + HOUR) for day in (8, 9)]
    make_service(config=night).create(cards=[6], start=at(13), end=at(13) + HOUR)
    with pytest.raises(NotPermitted) as refused:
        series(config=night).book(cards=[5], every="day", start="0:30", until="1:30", first="2026-12-07",
                                  last="2026-12-20")
    held = [f"card 5 is booked by bob from 2026-12-{day:02d} 00:30 (in {days} days) to 2026-12-{day:02d} 01:30"
            f" (booking {b.id})"
            for day, days, b in zip((8, 9), (8, 9), taken)]
    assert worded(refused.value) == (
        "the policy refuses 8 of 14 occurrences, so nothing was booked:"
        " you would hold 2 cards at once; the limit is 1 (Sun 2026-12-13 00:30);"
        " a booking may start at most 14 days ahead (7 occurrences, Mon 2026-12-14 00:30 to Sun 2026-12-20 00:30);"
        f" also 2 conflicts: Tue 2026-12-08 00:30: {held[0]}; Wed 2026-12-09 00:30: {held[1]};"
        " book up to --to 2026-12-12 now and add the rest later with 'board series extend';"
        " admins may pass --override-policy")


def test_an_override_skips_a_taken_occurrence_and_books_the_rest_and_an_extension_overrides_too(
        series, make_service, conn):
    """Finetune at 10:00 on prod breaks its window every weekday; bob holds card 0 on the first of them."""
    ten = int(datetime(2026, 12, 7, 10, tzinfo=BERLIN).timestamp())
    taken = make_service(name="bob", uid=1002, config=SEEDS).create(cards=[0], start=ten, end=ten + HOUR, klass="batch")
    root = series(name="root", uid=0, admin=True)
    made = root.book(cards=[0], klass="finetune", every="weekday", start="10:00", until="12:00", first="2026-12-07",
                     last="2026-12-09", override_policy=True, skip_conflicts=True)
    assert [(berlin(m.start), berlin(m.end)) for m in made.skipped] == [("Mon 2026-12-07 10:00", "Mon 2026-12-07 12:00")]
    assert f"(booking {taken.id})" in made.skipped[0].reason
    assert [berlin(b.start) for b in made.booked] == ["Tue 2026-12-08 10:00", "Wed 2026-12-09 10:00"]
    assert [berlin(m.start) for m in made.overridden] == ["Tue 2026-12-08 10:00", "Wed 2026-12-09 10:00"]
    grown = root.extend(made.series.id, "2026-12-10", override_policy=True)
    assert [berlin(b.start) for b in grown.booked] == ["Thu 2026-12-10 10:00"]
    assert [m.reason for m in grown.overridden] == [
        "card 0: class finetune is allowed on pool prod only 19:00-09:00 (Europe/Berlin) and at weekends"]


def test_an_extension_of_a_lapsed_series_starts_today_in_the_policy_zone(series, utc_reader):
    """Sunday 15:30 UTC is already Monday 00:30 in Tokyo: the new occurrences count from Monday."""
    tokyo = Config(policy=Policy(timezone="Asia/Tokyo", max_ahead_days=400))
    made = series(config=tokyo, now=FROZEN_NOW - 14 * 24 * HOUR).book(
        cards=[7], every="day", start="9:00", until="10:00", first="2026-11-16", last="2026-11-17")
    with pytest.raises(BadInput) as refused:
        series(config=tokyo).extend(made.series.id, "2027-12-02")
    assert worded(refused.value) == "2026-11-30 to 2027-12-02 is 367 days; extend a series by at most 366 days at a time"


def test_a_rule_stored_without_class_or_note_extends_as_an_experiment_with_no_note(series, conn):
    made = series().book(cards=[7], klass="batch", every="day", start="9:00", until="10:00", first="2026-12-07",
                         last="2026-12-07", note="nightly")
    bare = {k: v for k, v in made.series.rule.items() if k not in ("class", "note")}
    with write(conn):
        store.set_rule(conn, made.series.id, bare)
    (booking,) = series().extend(made.series.id, "2026-12-08").booked
    assert (booking.klass, booking.note) == ("experiment", "")


def test_a_hand_broken_rule_quotes_at_most_60_characters_of_what_is_wrong(series, conn):
    made = series().book(cards=[7], every="day", start="9:00", until="10:00", first="2026-12-07", last="2026-12-07")
    with write(conn):
        store.set_rule(conn, made.series.id, {**made.series.rule, "days": ["x" * 100]})
    with pytest.raises(BadInput) as refused:
        series().extend(made.series.id, "2026-12-08")
    quoted = ("invalid literal for int() with base 10: '" + "x" * 100)[:60]
    assert str(refused.value) == f"series {made.series.id} has a malformed rule ({quoted}); cancel it and book anew"


def test_a_series_extends_only_in_a_class_its_holder_may_still_use(series, conn):
    """[classes] changed after bob's online series was booked: its extension, even by an admin, is bob's and refused
    in one line; an admin's --override-policy takes it, each occurrence marked as overridden."""
    from msgspec.structs import replace

    made = series(name="bob", uid=1002).book(cards=[4], klass="online", every="day", start="9:00", until="10:00",
                                             first="2026-12-07", last="2026-12-08")
    kept = replace(SEEDS, classes={"online": ("alice",)})
    before = written(conn)
    with pytest.raises(NotPermitted) as refused:
        series(name="carol", uid=1003, admin=True, config=kept).extend(made.series.id, "2026-12-10")
    assert str(refused.value) == ("bob may not use class online: it is for alice ([classes] in the service's config);"
                                  " use batch or finetune or experiment")
    assert written(conn)[:2] == before[:2] and written(conn)[2] == before[2] + 1  # the refusal, audited
    assert series(name="bob", uid=1002, config=SEEDS).extend(made.series.id, "2026-12-09").booked  # before: fine
    forced = series(name="carol", uid=1003, admin=True, config=kept).extend(made.series.id, "2026-12-10",
                                                                            override_policy=True)
    assert len(forced.booked) == 1 and [m.reason for m in forced.overridden] == [str(refused.value)]
