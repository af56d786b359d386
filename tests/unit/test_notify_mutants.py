"""The notify formats and summary at their boundaries: what `make mutation` found no test told apart."""

from __future__ import annotations

import json
import time
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from app.notify.formats import LINE_LIMIT, SLACK_LIMIT, TRUNCATED, Message, body, plain, slack_text, truncate_utf8
from app.notify.summary import due_slot, summary
from tests.conftest import FROZEN_NOW
from tests.unit.test_notify_formats import card

HOUR = 3600


def test_one_line_is_cut_at_the_line_limit():
    assert plain("x" * LINE_LIMIT) == "x" * LINE_LIMIT
    assert plain("x" * (LINE_LIMIT + 1)) == "x" * (LINE_LIMIT - 1) + "…"


def test_an_unknown_target_type_is_named():
    with pytest.raises(ValueError, match="'pager'"):
        body("pager", Message("test", FROZEN_NOW, "t"))


def test_the_body_is_utf8_not_ascii_escapes():
    assert "°".encode() in body("slack", Message("test", FROZEN_NOW, "92 °C"))


def test_slack_keeps_text_of_exactly_its_limit_and_cuts_one_more():
    def text(last: int) -> Message:  # "*t*\n", then 38 lines of 999 and a newline each, then `last`
        return Message("test", FROZEN_NOW, "t", ("x" * 999,) * 38 + ("x" * last,))

    assert len(slack_text(text(996))) == SLACK_LIMIT and not slack_text(text(996)).endswith(TRUNCATED)
    cut, whole = slack_text(text(997)), "*t*\n" + "\n".join(text(997).lines)
    assert len(cut) == SLACK_LIMIT and cut == whole[: SLACK_LIMIT - len(TRUNCATED)] + TRUNCATED


def test_truncate_keeps_text_of_exactly_the_limit():
    assert truncate_utf8("€" * 10, 30) == "€" * 10


@pytest.fixture
def new_york(monkeypatch):
    """The service's own zone differs from the policy zone the summary is given."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def booked(index, user, end, upcoming=None, state="BOOKED", users=()):
    return card(index, state, 102400, 0, {"user": user, "start": FROZEN_NOW, "end": end}, upcoming, users)


def test_the_summary_in_the_policy_zone_with_no_card_free(new_york):
    shanghai = ZoneInfo("Asia/Shanghai")  # 15:30 UTC is 23:30 there, 10:30 in New York
    status = {"cards": [
        booked(0, "bob", FROZEN_NOW + HOUR, {"user": "carol", "start": FROZEN_NOW + 2 * HOUR, "end": FROZEN_NOW + 3 * HOUR}),
        booked(1, "alice", FROZEN_NOW + 5 * HOUR, state="LOST"),  # LOST: frees at no time anyone can count on
        card(2, "SQUATTED", users=["mallory", "eve"]),
        booked(3, "dan", FROZEN_NOW + 4 * HOUR),
        booked(4, "dan", FROZEN_NOW + 5 * HOUR),
        booked(5, "dan", FROZEN_NOW + 6 * HOUR),
        booked(6, "dan", FROZEN_NOW + 7 * HOUR),
    ]}
    message = summary(status, FROZEN_NOW, shanghai)
    assert message.lines[0] == "GPU 0: BOOKED, 100.0/31.8 GiB, 0 % busy, bob until Mon 00:30; next carol at Mon 01:30"
    assert message.lines[2] == "GPU 2: SQUATTED, 1.0/31.8 GiB, 0 % busy, mallory, eve"
    assert len(message.lines) == 7
    assert message.fields == (("Free now", "none"),
                              ("Free next", "GPU 0 at Mon 00:30; GPU 3 at Mon 03:30; GPU 4 at Mon 04:30; GPU 5 at Mon 05:30"))


def test_the_summary_lists_every_card_free_now():
    status = {"cards": [card(0, "FREE"), card(1, "LOST"), card(2, "FREE")]}
    assert summary(status, FROZEN_NOW, None).fields == (("Free now", "0,2"),)


def test_the_wire_body_round_trips_a_summary():
    message = summary({"cards": [card(0, "FREE")]}, FROZEN_NOW, ZoneInfo("UTC"))
    assert json.loads(body("webhook", message))["fields"] == {"Free now": "0"}


def test_the_due_slot_is_found_on_the_policy_zones_date(new_york):
    """01:00 on 1 December in Shanghai is still 30 November in New York: the 00:30 slot is Shanghai's today."""
    shanghai = ZoneInfo("Asia/Shanghai")
    now = int(datetime(2026, 12, 1, 1, 0, tzinfo=shanghai).timestamp())
    assert due_slot(now, ("00:30",), shanghai) == now - 30 * 60


def test_a_stored_message_without_lines_or_fields_still_reads():
    assert Message.from_json('{"kind": "test", "time": 1, "title": "t"}') == Message("test", 1, "t")


def test_the_due_slot_in_the_services_own_zone():
    now = int(datetime(2026, 12, 1, 9, 5).timestamp())  # naive: this process's zone
    assert due_slot(now, ("09:00",), None) == now - 5 * 60
