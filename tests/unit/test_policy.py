from datetime import datetime, timezone

import pytest

from app.config import ClassWindow, Config, Policy, Pool
from app.core import policy
from app.errors import NotPermitted

UTC = timezone.utc
PROD = Pool("prod", (0, 1, 2, 3), ("online", "batch", "finetune"), windows={"finetune": ClassWindow(19 * 60, 9 * 60)})
LAB = Pool("lab", (4, 5, 6, 7), max_hours=12)
CONFIG = Config(policy=Policy(max_booking_hours=48, max_ahead_days=7, max_cards_per_user=4), pools=(PROD, LAB))


def at(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp())


@pytest.mark.parametrize(
    "card, klass, start, end, refused",
    [
        (0, "online", "2026-12-01T10:00", "2026-12-01T12:00", None),
        (0, "experiment", "2026-12-01T10:00", "2026-12-01T12:00", "not allowed on pool prod"),
        (0, "finetune", "2026-12-01T10:00", "2026-12-01T12:00", "only 19:00-09:00 and at weekends"),  # Tuesday day
        (0, "finetune", "2026-12-01T19:00", "2026-12-02T09:00", None),  # the whole night window
        (0, "finetune", "2026-12-01T18:00", "2026-12-01T20:00", "only 19:00"),  # starts an hour early
        (0, "finetune", "2026-12-01T20:00", "2026-12-02T10:00", "only 19:00"),  # runs an hour late
        (0, "finetune", "2026-12-05T10:00", "2026-12-05T16:00", None),  # Saturday
        (0, "finetune", "2026-12-04T20:00", "2026-12-07T09:00", None),  # Friday night to Monday morning
        (0, "finetune", "2026-12-04T20:00", "2026-12-07T10:00", "only 19:00"),  # into Monday working hours
        (5, "finetune", "2026-12-01T10:00", "2026-12-01T12:00", None),  # lab takes anything
        (5, "experiment", "2026-12-01T00:00", "2026-12-01T13:00", "at most 12 h"),
    ],
)
def test_card_refusal(card, klass, start, end, refused):
    reason = policy.card_refusal(CONFIG, card, klass, at(start), at(end), tz=UTC)
    if refused is None:
        assert reason is None
    else:
        assert reason is not None and refused in reason


def check(**overrides):
    args = dict(cards=(4,), klass="experiment", start=at("2026-12-01T10:00"), end=at("2026-12-01T12:00"),
                now=at("2026-12-01T09:00"), held=(), tz=UTC)
    args.update(overrides)
    policy.check(CONFIG, **args)


def test_check_accepts_a_plain_booking():
    check()


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"end": at("2026-12-03T11:00"), "cards": (4,), "klass": "experiment"}, "at most 48 h"),
        ({"start": at("2026-12-09T10:00"), "end": at("2026-12-09T11:00")}, "at most 7 days ahead"),
        ({"cards": (4, 5), "held": [(at("2026-12-01T11:00"), at("2026-12-01T14:00"), 3)]}, "hold 5 cards at once"),
    ],
)
def test_check_refuses_with_the_rule(overrides, message):
    with pytest.raises(NotPermitted, match=message):
        check(**overrides)


def test_cards_held_at_different_times_do_not_add_up():
    held = [(at("2026-12-01T08:00"), at("2026-12-01T10:00"), 3), (at("2026-12-01T12:00"), at("2026-12-01T13:00"), 3)]
    check(cards=(4,), held=held)  # 3 before, 3 after, never 4 at once with the new one
    with pytest.raises(NotPermitted):
        check(cards=(4, 5), held=held + [(at("2026-12-01T11:00"), at("2026-12-01T11:30"), 3)])


def test_windows_are_read_in_the_configured_zone_whatever_the_process_zone():
    from dataclasses import replace

    # 20:00-23:00 UTC is 04:00-07:00 the next morning in Shanghai: inside the night window there, not in UTC.
    start, end = at("2026-12-01T20:00"), at("2026-12-01T23:00")
    shanghai = replace(CONFIG, policy=replace(CONFIG.policy, timezone="Asia/Shanghai"))
    berlin = replace(CONFIG, policy=replace(CONFIG.policy, timezone="Europe/Berlin"))  # 21:00-24:00 there: inside too
    early = at("2026-12-01T10:30"), at("2026-12-01T11:30")  # 18:30 in Shanghai: outside; 11:30 in Berlin: outside
    assert policy.card_refusal(shanghai, 0, "finetune", start, end) is None
    assert policy.card_refusal(berlin, 0, "finetune", start, end) is None
    assert "only 19:00-09:00" in policy.card_refusal(shanghai, 0, "finetune", *early)
    assert "only 19:00-09:00" in policy.card_refusal(berlin, 0, "finetune", *early)
    assert policy.card_refusal(shanghai, 0, "finetune", at("2026-12-01T11:00"), at("2026-12-01T12:00")) is None  # 19-20h
