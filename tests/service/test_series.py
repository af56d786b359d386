"""Standing slots over the client interface the CLI and TUI use: in process and through the real socket.

The service reads clock times in its policy zone: here no [policy] timezone, so its own local time,
which is this process's for the local transport and UTC for the agent (it runs with TZ=UTC).
"""

from __future__ import annotations

import json
import time
from datetime import date, datetime, timedelta, timezone

import pytest

from app.core.series import wall
from app.errors import BadInput, Conflict, NotPermitted
from tests.service.test_behaviour import BOOKING_KEYS, ME, everything, events_of, one_line_error

HOUR = 3600


@pytest.fixture
def zone(target):
    """The zone the service reads clock times in (None: this process's local time)."""
    return timezone.utc if target.transport == "socket" else None


def today(zone) -> date:
    return datetime.fromtimestamp(time.time(), zone).date()


def day(zone, n: int) -> str:
    return (today(zone) + timedelta(days=n)).isoformat()


def clock(epoch: int, zone) -> str:
    return datetime.fromtimestamp(epoch, zone).strftime("%a %H:%M")


def weekdays(first: date, last: date) -> list[date]:
    return [first + timedelta(days=i) for i in range((last - first).days + 1) if (first + timedelta(days=i)).weekday() < 5]


def test_a_weekday_series_is_one_booking_per_weekday_linked_by_its_id(client, zone):
    made = client.call("series_book", cards=[0, 1], every="weekday", start="9:00", until="19:00", to=day(zone, 14),
                       note="prod TP4", **{"class": "online", "from": day(zone, 1)})
    expected = weekdays(today(zone) + timedelta(days=1), today(zone) + timedelta(days=14))
    found = made["bookings"]
    assert len(found) == len(expected) and made["skipped"] == [] and made["overridden"] == []
    assert [datetime.fromtimestamp(b["start"], zone).date() for b in found] == expected
    assert {clock(b["start"], zone)[-5:] + "-" + clock(b["end"], zone)[-5:] for b in found} == {"09:00-19:00"}
    series = made["series"]
    assert (series["user"], series["rule"]["every"], series["rule"]["cards"]) == (ME, "weekday", [0, 1])
    for booking in found:
        assert set(booking) == BOOKING_KEYS
        assert (booking["series_id"], booking["cards"], booking["class"], booking["note"]) == (
            series["id"], [0, 1], "online", "prod TP4")
    assert [b["series_id"] for b in client.call("list")["bookings"]] == [series["id"]] * len(found)
    shown = client.call("series_get", id=series["id"])
    assert shown == {"series": series, "bookings": found}


def test_a_night_series_ends_each_next_morning(client, zone):
    made = client.call("series_book", cards=[4, 5], every="day", start="19:00", until="7:00", to=day(zone, 3),
                       **{"class": "finetune", "from": day(zone, 1)})
    spans = [(datetime.fromtimestamp(b["start"], zone), datetime.fromtimestamp(b["end"], zone)) for b in made["bookings"]]
    assert len(spans) == 3
    for start, end in spans:
        assert (start.strftime("%H:%M"), end.strftime("%H:%M")) == ("19:00", "07:00")
        assert end.date() == start.date() + timedelta(days=1)


def test_conflicts_are_listed_with_the_holder_and_nothing_is_booked(client, zone):
    third = today(zone) + timedelta(days=3)
    holder = client.call("book", cards=[1], start=wall(third, 600, zone), end=wall(third, 720, zone))
    before, audit = everything(client), events_of(client)
    with pytest.raises(Conflict) as refused:
        client.call("series_book", cards=[1, 2], every="day", start="9:00", until="19:00", to=day(zone, 5),
                    **{"from": day(zone, 1)})
    message = str(refused.value)
    assert message.startswith("1 of 5 occurrences conflicts, so nothing was booked: ")
    assert f"card 1 is booked by {ME}" in message and f"(booking {holder['id']})" in message
    assert message.endswith("pass --skip-conflicts to book the other 4") and refused.value.exit_code == 3
    assert everything(client) == before
    added = [e for e in events_of(client) if e["id"] not in {e["id"] for e in audit}]
    assert [(e["action"], e["ok"]) for e in added] == [("series", False)]


def test_skip_conflicts_books_the_free_ones_and_lists_the_skipped(client, zone):
    third = today(zone) + timedelta(days=3)
    holder = client.call("book", cards=[1], start=wall(third, 600, zone), end=wall(third, 720, zone))
    made = client.call("series_book", cards=[1, 2], every="day", start="9:00", until="19:00", to=day(zone, 5),
                       skip_conflicts=True, **{"from": day(zone, 1)})
    assert len(made["bookings"]) == 4
    (skipped,) = made["skipped"]
    assert datetime.fromtimestamp(skipped["start"], zone).date() == third
    assert f"(booking {holder['id']})" in skipped["reason"]
    with pytest.raises(Conflict, match="all 5 occurrences conflict"):  # nothing left to book: still a conflict
        client.call("series_book", cards=[1, 2], every="day", start="9:00", until="19:00", to=day(zone, 5),
                    skip_conflicts=True, **{"from": day(zone, 1)})


def test_the_policy_applies_to_each_occurrence(client, zone):
    before = everything(client)
    with pytest.raises(NotPermitted) as refused:
        client.call("series_book", cards=[6], every="day", start="9:00", until="10:00", to=day(zone, 40),
                    **{"from": day(zone, 1)})
    assert "a booking may start at most 30 days ahead" in str(refused.value) and refused.value.exit_code == 4
    assert everything(client) == before


def test_skip_conflicts_does_not_skip_a_policy_refusal(client, zone):
    """A conflict on day 3 and occurrences past max_ahead_days (30): --skip-conflicts passes over the conflict only,
    and the policy still refuses the whole series, booking or extending (exit 4, nothing written)."""
    third = today(zone) + timedelta(days=3)
    holder = client.call("book", cards=[1], start=wall(third, 600, zone), end=wall(third, 720, zone))
    before, audit = everything(client), events_of(client)
    with pytest.raises(NotPermitted) as refused:
        client.call("series_book", cards=[1, 2], every="day", start="9:00", until="19:00", to=day(zone, 33),
                    skip_conflicts=True, **{"from": day(zone, 1)})
    message = str(refused.value)
    assert refused.value.exit_code == 4 and message.startswith("the policy refuses ") and "30 days ahead" in message
    assert "; also 1 conflict: " in message and f"(booking {holder['id']})" in message
    made = client.call("series_book", cards=[1, 2], every="day", start="9:00", until="19:00", to=day(zone, 2),
                       **{"from": day(zone, 1)})
    with pytest.raises(NotPermitted) as refused:  # its new days hold the same conflict and the same refusals
        client.call("series_extend", id=made["series"]["id"], to=day(zone, 33), skip_conflicts=True)
    assert "30 days ahead" in str(refused.value) and f"(booking {holder['id']})" in str(refused.value)
    added = [e for e in events_of(client) if e["id"] not in {e["id"] for e in audit}]
    assert [(e["action"], e["ok"]) for e in added if e["action"] != "create"] == [
        ("series_extend", False), ("series", True), ("series", False)]
    assert sorted(b["id"] for b in everything(client)) == sorted(b["id"] for b in before + made["bookings"])


def test_cancel_one_occurrence_or_the_series_ahead(client, zone):
    made = client.call("series_book", cards=[3], every="day", start="9:00", until="10:00", to=day(zone, 4),
                       **{"from": day(zone, 1)})
    first, *rest = made["bookings"]
    assert client.call("cancel", id=first["id"])["status"] == "cancelled"  # one occurrence, as any booking
    assert client.call("series_get", id=made["series"]["id"])["bookings"][0]["status"] == "cancelled"
    done = client.call("series_cancel", id=made["series"]["id"])
    assert [b["id"] for b in done["cancelled"]] == [b["id"] for b in rest] and done["running"] == []
    assert {b["status"] for b in done["cancelled"]} == {"cancelled"} and client.call("list")["bookings"] == []
    assert done["series"]["rule"]["cancelled_at"] is not None
    with pytest.raises(BadInput, match="already cancelled"):
        client.call("series_cancel", id=made["series"]["id"])


def test_extend_books_the_new_occurrences_under_the_same_id(client, zone):
    made = client.call("series_book", cards=[2], every="day", start="13:00", until="14:00", to=day(zone, 2),
                       **{"from": day(zone, 1)})
    grown = client.call("series_extend", id=made["series"]["id"], to=day(zone, 5))
    assert [datetime.fromtimestamp(b["start"], zone).date().isoformat() for b in grown["bookings"]] == [
        day(zone, 3), day(zone, 4), day(zone, 5)]
    assert {b["series_id"] for b in grown["bookings"]} == {made["series"]["id"]}
    assert grown["series"]["rule"]["to"] == day(zone, 5)
    assert len(client.call("series_get", id=made["series"]["id"])["bookings"]) == 5
    with pytest.raises(BadInput, match="is not after the series' last day"):
        client.call("series_extend", id=made["series"]["id"], to=day(zone, 5))


@pytest.mark.parametrize(
    "ask, message",
    [
        ({"every": "fortnight"}, "can't read --every 'fortnight'"),
        ({"to": "d1"}, "--to"),  # replaced below by a date before --from
        ({"every": "weekend", "to": "weekdays"}, "no occurrences"),
        ({"start": "tomorrow 9:00"}, "can't read --start 'tomorrow 9:00' as a time of day"),
        ({"to": None}, "series_book: missing argument 'to'"),
    ],
)
def test_bad_input_is_exit_2_and_writes_nothing(client, zone, ask, message):
    monday = today(zone) + timedelta(days=7 - today(zone).weekday())  # next Monday, 1 to 7 days ahead
    args = {"cards": [7], "every": "day", "start": "9:00", "until": "10:00", "from": monday.isoformat(),
            "to": (monday + timedelta(days=2)).isoformat(), **ask}
    if args["to"] == "d1":
        args["to"] = (monday - timedelta(days=1)).isoformat()
    if args["to"] == "weekdays":
        args["to"] = (monday + timedelta(days=4)).isoformat()
    before, audit = everything(client), events_of(client)
    with pytest.raises(BadInput) as refused:
        client.call("series_book", **args)
    assert message in str(refused.value) and refused.value.exit_code == 2
    assert everything(client) == before and events_of(client) == audit


def test_the_cli_books_lists_shows_and_cancels_a_series(cli):
    # The CLI runs with TZ=UTC, and so does the service it reaches in both transports.
    rc, out, err = cli("book", "--cards", "0-3", "--class", "online", "--every", "weekday", "--start", "9:00",
                       "--until", "19:00", "--from", "tomorrow", "--to", "+10d", "--note", "prod TP4", "--json")
    assert rc == 0, err
    made = json.loads(out)
    series_id = made["series"]["id"]
    assert made["bookings"] and {b["series_id"] for b in made["bookings"]} == {series_id}
    assert {(b["start"][11:], b["end"][11:]) for b in made["bookings"]} == {("09:00:00+00:00", "19:00:00+00:00")}
    rc, out, err = cli("list")
    assert rc == 0 and f"online (series {series_id})" in out.splitlines()[0], err
    rc, out, err = cli("list", "--json")
    assert {b["series_id"] for b in json.loads(out)["bookings"]} == {series_id}
    rc, out, err = cli("series", "show", str(series_id))
    assert rc == 0 and out.startswith(f"series {series_id} {ME}: cards 0,1,2,3 online, every weekday 09:00-19:00")
    rc, out, err = cli("book", "--cards", "4", "--every", "fortnight", "--start", "9", "--until", "10", "--to", "+3d")
    assert rc == 2 and "can't read --every 'fortnight'" in one_line_error(err)
    rc, out, err = cli("book", "--cards", "4", "--every", "day", "--start", "9", "--until", "10")
    assert rc == 2 and "give --to DATE" in one_line_error(err)
    rc, out, err = cli("series", "cancel", str(series_id))
    assert rc == 0 and out.startswith(f"cancelled series {series_id} "), err
    assert cli("list")[1].startswith("no bookings")
