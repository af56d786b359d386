from datetime import datetime, timezone

import pytest

from app.core.text import format_cards, format_elapsed, format_time, inert


@pytest.mark.parametrize(
    "raw, shown",
    [
        ("alice", "alice"),
        ("[bold red]x[/]", "[bold red]x[/]"),  # Rich markup is the caller's to escape: it stays text here
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("\x1b]8;;http://evil/\x07link", "\\x1b]8;;http://evil/\\x07link"),
        ("abc\u202edcba", "abc\\u202edcba"),  # a bidi override
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("nul\x00", "nul\\x00"),
        ("c1\x9b", "c1\\x9b"),
        ("line\u2028sep", "line\\u2028sep"),
        ("👩\u200d💻 ok", "👩\u200d💻 ok"),  # the joiner inside an emoji is harmless
    ],
)
def test_inert_makes_controls_visible(raw, shown):
    assert inert(raw) == shown


def test_inert_truncates_with_an_ellipsis():
    assert inert("abcdefgh", 5) == "abcd…" and inert("abc", 5) == "abc"


@pytest.mark.parametrize(
    "seconds, shown",
    [(None, "n/a"), (-5, "0:00"), (59, "0:59"), (3599, "59:59"), (3600, "1h00m"), (86399, "23h59m"), (90000, "1d1h")],
)
def test_format_elapsed(seconds, shown):
    assert format_elapsed(seconds) == shown


def test_format_cards_and_time(monkeypatch):
    import time

    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        now = datetime(2026, 11, 29, 15, 30, tzinfo=timezone.utc).timestamp()
        assert format_cards((0, 1, 4)) == "0,1,4"
        assert format_time(int(now) + 1800, now) == "16:00"
        assert format_time(int(now) + 86400, now) == "Mon 15:30"
        assert format_time(int(now) + 8 * 86400, now) == "2026-12-07 15:30"
    finally:
        monkeypatch.undo()
        time.tzset()
