from datetime import datetime, timezone

import pytest

from app.core.text import format_cards, format_duration, format_elapsed, format_time, inert, relative


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
        ("para\u2029sep", "para\\u2029sep"),
        ("👩\u200d💻 ok", "👩\u200d💻 ok"),  # the joiner inside an emoji is harmless
    ],
)
def test_inert_makes_controls_visible(raw, shown):
    assert inert(raw) == shown


def test_inert_truncates_with_an_ellipsis():
    assert inert("abcdefgh", 5) == "abcd…" and inert("abc", 5) == "abc"
    assert inert("abcde", 5) == "abcde"  # exactly the limit: nothing cut
    assert inert("abc", 1) == "…"


@pytest.mark.parametrize(
    "seconds, shown",
    [(None, "n/a"), (-5, "0:00"), (59, "0:59"), (3000, "50:00"), (3599, "59:59"), (3600, "1h00m"), (5400, "1h30m"),
     (86399, "23h59m"), (86400, "1d0h"), (90000, "1d1h"), (2 * 86400, "2d0h")],
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
        assert format_time(int(now) + 6 * 86400, now) == "Sat 15:30"
        assert format_time(int(now) + 7 * 86400, now) == "2026-12-06 15:30"  # a week on: the weekday is ambiguous
        assert format_time(int(now) + 8 * 86400, now) == "2026-12-07 15:30"
        assert format_time(int(now) - 86400, now) == "2026-11-28 15:30"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_format_time_without_now_reads_the_clock(monkeypatch):
    import time

    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        now = datetime(2026, 11, 29, 15, 30, tzinfo=timezone.utc).timestamp()
        monkeypatch.setattr(time, "time", lambda: now)
        assert format_time(int(now) + 1800) == "16:00"
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize(
    "seconds, shown",
    [(0, "now"), (59, "now"), (-59, "now"), (60, "in 1 min"), (45 * 60, "in 45 min"), (-45 * 60, "45 min ago"),
     (89 * 60, "in 89 min"), (90 * 60, "in 2 h"), (3 * 3600 + 20 * 60, "in 3 h"), (5 * 3600 - 60, "in 5 h"),
     (-26 * 3600, "26 h ago"), (36 * 3600 - 1, "in 36 h"), (36 * 3600, "in 2 days"), (3 * 86400, "in 3 days"),
     (-10 * 86400, "10 days ago")],
)
def test_relative_says_how_far_away(seconds, shown):
    now = 1795966200
    assert relative(now + seconds, now) == shown


@pytest.mark.parametrize(
    "seconds, shown",
    [(0, "0m"), (59, "0m"), (-120, "0m"), (45 * 60, "45m"), (3 * 3600, "3h"), (90 * 60, "1h30m"), (86400, "1d"),
     (25 * 3600, "1d1h"), (2 * 86400 + 4 * 3600 + 60, "2d4h1m"), (86400 + 30 * 60, "1d30m")],
)
def test_format_duration_in_the_forms_the_time_parser_reads(seconds, shown):
    assert format_duration(seconds) == shown


class TestStamps:
    """The service writes times as stamps; the reader's client words them in the reader's zone (B1)."""

    NOW = int(datetime(2026, 11, 29, 15, 30, tzinfo=timezone.utc).timestamp())  # a Sunday

    @pytest.mark.parametrize("zone, said", [
        ("UTC", "until 17:30 (in 2 h); from 15:30; on Sun 2026-11-29 15:30"),
        ("Asia/Shanghai", "until Mon 01:30 (in 2 h); from 23:30; on Sun 2026-11-29 23:30"),
        ("America/New_York", "until 12:30 (in 2 h); from 10:30; on Sun 2026-11-29 10:30"),
    ])
    def test_a_message_reads_in_the_zone_it_is_worded_in(self, zone, said):
        from zoneinfo import ZoneInfo

        from app.core.text import localize, stamp_day, stamp_time, stamp_when

        message = (f"until {stamp_when(self.NOW + 7200, self.NOW)}; from {stamp_time(self.NOW, self.NOW)};"
                   f" on {stamp_day(self.NOW)}")
        assert localize(message, ZoneInfo(zone)) == said

    def test_the_process_zone_is_the_default(self, monkeypatch):
        import time

        from app.core.text import localize, stamp_time

        monkeypatch.setenv("TZ", "Asia/Shanghai")
        time.tzset()
        try:
            assert localize(f"at {stamp_time(self.NOW, self.NOW)}") == "at 23:30"
        finally:
            monkeypatch.undo()
            time.tzset()

    @pytest.mark.parametrize("text", ["no stamp here", "<@when:12>", "<@time:x:1>", "<@day:1:2:3>", "a <@ b",
                                      "<@time:999999999999999:1>"])
    def test_anything_else_is_left_as_it_is(self, text):
        from app.core.text import localize

        assert localize(text, timezone.utc) == text

    def test_a_stamp_in_a_json_line_keeps_it_json(self):
        import json

        from app.core.text import stamp_when
        from app.client.stamps import receive

        line = json.dumps({"error": {"message": f'"quoted" until {stamp_when(self.NOW, self.NOW)}'}}).encode()
        assert receive(line)["error"]["message"].startswith('"quoted" until ')
        assert "<@" not in receive(line)["error"]["message"]


class TestZoneName:
    """A zone as people name it, for the lines that say which zone their times are in."""

    @pytest.fixture
    def tz_env(self, monkeypatch):
        import time

        def set_tz(value: str | None) -> None:
            if value is None:
                monkeypatch.delenv("TZ", raising=False)
            else:
                monkeypatch.setenv("TZ", value)
            time.tzset()

        yield set_tz
        monkeypatch.undo()
        time.tzset()

    def test_a_given_zone_by_its_key_else_its_name_for_now_else_itself(self):
        from datetime import timedelta, tzinfo
        from zoneinfo import ZoneInfo

        from app.core.text import zone_name

        class Named(tzinfo):
            def utcoffset(self, dt):
                return timedelta(hours=5)

            def dst(self, dt):
                return timedelta(0)

            def tzname(self, dt):
                return "Tashkent" if dt is not None else "never asked without a time"

        class Nameless(Named):
            def tzname(self, dt):
                return None

            def __str__(self):
                return "UTC+5 by hand"

        assert zone_name(ZoneInfo("Asia/Shanghai")) == "Asia/Shanghai"
        assert zone_name(timezone(timedelta(hours=8))) == "UTC+08:00"
        assert zone_name(Named()) == "Tashkent"
        assert zone_name(Nameless()) == "UTC+5 by hand"

    @pytest.mark.parametrize("tz, name", [
        ("Asia/Shanghai", "Asia/Shanghai"),
        (":Asia/Shanghai", "Asia/Shanghai"),  # glibc's leading colon
        ("XST-8", "XST-8"),  # a POSIX rule without DST changes is named by itself
        ("/usr/share/zoneinfo/Asia/Shanghai", "Asia/Shanghai"),
        (":/usr/share/zoneinfo/America/New_York", "America/New_York"),
        ("/srv/zoneinfo/tzdata/share/zoneinfo/Europe/Berlin", "Europe/Berlin"),  # the tree's own folder is the last
        ("/srv/tz/Europe/Berlin", "UTC"),  # no zoneinfo tree (and no such file: glibc reads it as UTC): the abbreviation
    ])
    def test_the_process_zone_is_named_by_tz(self, tz_env, tz, name):
        from app.core.text import zone_name

        tz_env(tz)
        assert zone_name() == name

    def test_a_posix_rule_with_dst_changes_is_named_by_its_abbreviation_now(self, tz_env):
        from app.core.text import zone_name

        tz_env("CET-1CEST,M3.5.0,M10.5.0/3")
        assert zone_name() in ("CET", "CEST")

    def test_without_tz_the_zone_is_etc_localtimes(self, tz_env):
        import os

        from app.core.text import zone_name

        target = os.path.realpath("/etc/localtime")
        if "/zoneinfo/" not in target:
            pytest.skip("/etc/localtime is no link into a zoneinfo tree here")
        tz_env(None)
        assert zone_name() == target.rsplit("/zoneinfo/", 1)[1]


@pytest.mark.parametrize("cards, host, here, said", [
    ([4], "", "", "card 4"),
    ([0, 1], "", "", "cards 0,1"),
    ([0, 1], "gpu1", "gpu1", "cards 0,1"),  # this host's cards go without it
    ([3], "", "gpu1", "card 3"),  # no host recorded (before the fleet): this host's
    ([2], "gpu2", "gpu1", "card gpu2:2"),
    ([0, 1], "gpu2", "", "cards gpu2:0,1"),
    ([0], "gpu\x1b[2J" + "x" * 70, "gpu1", "card gpu\\x1b[2J" + "x" * 52 + "…:0"),  # another's host name is inert
])
def test_cards_text_names_another_hosts_cards_with_its_host(cards, host, here, said):
    from app.core.text import cards_text, host_cards

    assert cards_text(cards, host, here) == said
    assert host_cards(cards, host, here) == said.split(" ", 1)[1]


def test_cards_without_a_host_are_this_hosts():
    from app.core.text import cards_text, host_cards

    assert (cards_text([4]), host_cards([0, 1])) == ("card 4", "0,1")


def test_today_is_the_date_in_the_zone_asked_not_the_process_zone(monkeypatch):
    """11:00 UTC on 1 Dec is already 01:00 on 2 Dec at UTC+14: an hour later is today there, shown bare."""
    import time
    from zoneinfo import ZoneInfo

    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    now = datetime(2026, 12, 1, 11, 0, tzinfo=timezone.utc).timestamp()
    try:
        assert format_time(int(now + 3600), now, ZoneInfo("Pacific/Kiritimati")) == "02:00"
    finally:
        monkeypatch.undo()
        time.tzset()
