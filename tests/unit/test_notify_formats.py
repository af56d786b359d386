"""Pushes on the wire (app.notify.formats), the [notify] config, the summary and its schedule: pure pieces."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

from app.config import ConfigError, load_config
from app.notify.formats import LINE_LIMIT, SLACK_LIMIT, TRUNCATED, WECOM_LIMIT, Message, body, plain, slack_text, truncate_utf8
from app.notify.summary import GRACE_S, due_slot, summary
from tests.conftest import FROZEN_NOW

MESSAGE = Message("alert.firing", FROZEN_NOW, "GPU 3 at 92 °C", ("held by alice", "since 14:00"),
                  (("card", "3"), ("holder", "alice")))
HOSTILE = "<@U024BE7LH> <!channel> @all [click](http://evil.example) *bold* _it_ `code` # head &lt;@U1&gt; | ~s~ \\"


def decoded(target_type: str, message: Message = MESSAGE) -> dict:
    return json.loads(body(target_type, message))


class TestFormats:
    def test_wecom_is_a_markdown_message(self):
        assert decoded("wecom") == {"msgtype": "markdown", "markdown": {
            "content": "**GPU 3 at 92 °C**\n> card: 3\n> holder: alice\nheld by alice\nsince 14:00"}}

    def test_slack_is_text_in_mrkdwn(self):
        assert decoded("slack") == {"text": "*GPU 3 at 92 °C*\ncard: 3\nholder: alice\nheld by alice\nsince 14:00"}

    def test_webhook_is_plain_json(self):
        assert decoded("webhook") == {"kind": "alert.firing", "time": "2026-11-29T15:30:00Z", "title": "GPU 3 at 92 °C",
                                      "text": "held by alice\nsince 14:00", "fields": {"card": "3", "holder": "alice"}}

    def test_a_message_survives_the_outbox_round_trip(self):
        assert Message.from_json(MESSAGE.to_json()) == MESSAGE

    @pytest.mark.parametrize("target_type", ["wecom", "slack"])
    def test_user_text_starts_no_markup_link_or_mention(self, target_type):
        hostile = Message("alert.firing", FROZEN_NOW, HOSTILE, (HOSTILE, "two\nlines\u202e"), ((HOSTILE, HOSTILE),))
        payload = decoded(target_type, hostile)
        content = payload["markdown"]["content"] if target_type == "wecom" else payload["text"]
        title, field, *lines = content.split("\n")
        wrap = "**" if target_type == "wecom" else "*"
        assert title.startswith(wrap) and title.endswith(wrap)
        if target_type == "wecom":
            assert field.startswith("> ")
        user_text = [title[len(wrap):-len(wrap)], field.removeprefix("> "), *lines]
        for text in user_text:
            assert not set(text) & set("<>@[]*_`#&|~"), text
        assert "＜＠U024BE7LH＞" in content and "＠all" in content and "［click］(http:" in content
        assert lines[-1] == "two\\x0alines\\u202e"  # one line stays one line; the bidi override is shown, not obeyed

    def test_generic_json_keeps_the_text_as_data_but_inert(self):
        hostile = Message("test", FROZEN_NOW, "t", ("a\nb\x1b[31m",))
        assert decoded("webhook", hostile)["text"] == "a\\x0ab\\x1b[31m"

    def test_wecom_stays_within_4096_bytes_and_cuts_on_a_character(self):
        long = Message("summary", FROZEN_NOW, "板", tuple("显卡空闲" * 50 for _ in range(40)))
        content = decoded("wecom", long)["markdown"]["content"]
        assert len(content.encode()) <= WECOM_LIMIT
        assert content.endswith(TRUNCATED) and len(content.encode()) > WECOM_LIMIT - 4  # full, not half empty
        content.encode().decode("utf-8")  # strict: no half character

    def test_truncate_utf8_on_every_byte_boundary(self):
        text = "€" * 2000  # 3 bytes each
        for limit in range(len(TRUNCATED.encode()) + 1, 60):
            cut = truncate_utf8(text, limit)
            assert len(cut.encode()) <= limit and cut.endswith(TRUNCATED) and set(cut[: -len(TRUNCATED)]) <= {"€"}
        assert truncate_utf8("short", 100) == "short"


class TestConfig:
    def load(self, tmp_path, text: str):
        path = tmp_path / "board.toml"
        path.write_text(text)
        return load_config(environ={"BOARD_CONFIG": str(path)})

    def test_targets_and_defaults(self, tmp_path):
        config = self.load(tmp_path, '[[notify.targets]]\ntype = "wecom"\nurl = "https://qyapi.example/send?key=SEKRIT"\n'
                                     '[[notify.targets]]\nname = "ops"\ntype = "slack"\nurl = "https://hooks.example/T/B/X"\n')
        assert [(t.name, t.type) for t in config.notify.targets] == [("wecom", "wecom"), ("ops", "slack")]
        assert config.notify.summary_at == ("09:00",) and config.notify.max_attempts == 8
        assert "SEKRIT" not in repr(config)

    @pytest.mark.parametrize("text, says", [
        ('[[notify.targets]]\ntype = "teams"\nurl = "https://x.example/SEKRIT"\n', "type is 'teams'"),
        ('[[notify.targets]]\ntype = "slack"\nurl = "ftp://x.example/SEKRIT"\n', "http:// or https://"),
        ('[[notify.targets]]\ntype = "slack"\nurl = "SEKRIT"\n', "http:// or https://"),
        ('[[notify.targets]]\ntype = "slack"\n', "give url, or url_file"),
        ('[[notify.targets]]\ntype = "slack"\nurl = "https://a.example/SEKRIT"\nurl_file = "/etc/x"\n', "not both"),
        ('[[notify.targets]]\ntype = "slack"\nurl_file = "SEKRIT"\n', "url_file must be an absolute path"),
        ('[[notify.targets]]\ntype = "slack"\nurl = "https://a.example/SEKRIT"\n'
         '[[notify.targets]]\ntype = "slack"\nurl = "https://b.example/SEKRIT"\n', "two targets have this name"),
        ('[[notify.targets]]\ntype = "slack"\nurl = "https://a.example/SEKRIT"\nkey = "SEKRIT"\n', "unknown key 'key'"),
        ('[notify]\nsummary_at = ["9am"]\n', "summary_at has '9am'"),
        ('[notify]\nsummary_at = "09:00"\n', '[notify] summary_at: expected a list, got "09:00"'),
        ('[notify]\ntimeout_s = 0\n', "timeout_s must be a number more than 0"),
        ('[notify]\nretries = 3\n', "unknown key 'retries' in [notify]"),
    ])
    def test_bad_settings_are_one_line_without_the_secret(self, tmp_path, text, says):
        with pytest.raises(ConfigError) as caught:
            self.load(tmp_path, text)
        assert says in str(caught.value) and "SEKRIT" not in str(caught.value) and "\n" not in str(caught.value)


def card(index, state, used=1024, util=0, booking=None, upcoming=None, users=()):
    return {"index": index, "state": state, "memory_used_mib": used, "memory_total_mib": 32607,
            "utilization_pct": util, "booking": booking, "next_booking": upcoming, "users": list(users)}


class TestSummary:
    def test_every_card_and_what_frees_next(self):
        hour = 3600
        status = {"cards": [
            card(0, "FREE"),
            card(1, "IN USE", 30720, 97, {"user": "alice", "start": FROZEN_NOW - hour, "end": FROZEN_NOW + 2 * hour},
                 users=["alice"]),
            card(2, "BOOKED", 0, 0, {"user": "bob", "start": FROZEN_NOW, "end": FROZEN_NOW + hour},
                 {"user": "carol", "start": FROZEN_NOW + hour, "end": FROZEN_NOW + 3 * hour}),
            card(3, "SQUATTED", 2048, 40, users=["mallory"]),
            card(4, "LOST", None, None),
        ]}
        message = summary(status, FROZEN_NOW, timezone.utc)
        assert message.title == "Board at 15:30 (UTC): 1 of 5 cards free"
        assert message.lines == (
            "GPU 0: FREE, 1.0/31.8 GiB, 0 % busy, nobody",
            "GPU 1: IN USE, 30.0/31.8 GiB, 97 % busy, alice until 17:30",
            "GPU 2: BOOKED, 0.0/31.8 GiB, 0 % busy, bob until 16:30; next carol at 16:30",
            "GPU 3: SQUATTED, 2.0/31.8 GiB, 40 % busy, mallory",
            "GPU 4: LOST, ?/31.8 GiB, ? % busy, nobody",
        )
        assert message.fields == (("Free now", "0"), ("Free next", "GPU 1 at 17:30; GPU 2 at 18:30"))

    def test_due_slot_is_the_latest_time_passed_within_the_grace(self):
        def at(hhmm: str) -> int:
            return int(datetime(2026, 12, 1, *map(int, hhmm.split(":")), tzinfo=timezone.utc).timestamp())

        times = ("09:00", "17:30")
        assert due_slot(at("08:59"), times, timezone.utc) is None
        assert due_slot(at("09:00"), times, timezone.utc) == at("09:00")
        assert due_slot(at("09:00") + GRACE_S - 1, times, timezone.utc) == at("09:00")
        assert due_slot(at("09:00") + GRACE_S, times, timezone.utc) is None  # the service was down too long
        assert due_slot(at("17:45"), times, timezone.utc) == at("17:30")
        assert due_slot(at("00:10"), ("23:50",), timezone.utc) == at("00:10") - 20 * 60  # yesterday's slot

    def test_the_slot_is_wall_clock_in_the_policy_zone(self):
        from zoneinfo import ZoneInfo

        berlin = ZoneInfo("Europe/Berlin")
        nine = int(datetime(2026, 7, 1, 9, 0, tzinfo=berlin).timestamp())  # 07:00 UTC in summer
        assert due_slot(nine + 60, ("09:00",), berlin) == nine

    def test_times_are_in_the_policy_zone_and_labelled_with_it(self, monkeypatch):
        """A push goes to the whole team: the policy zone's times, named, whatever the service's own TZ."""
        from zoneinfo import ZoneInfo

        monkeypatch.setenv("TZ", "America/New_York")
        time.tzset()
        try:
            status = {"cards": [card(0, "BOOKED", booking={"user": "bob", "start": FROZEN_NOW, "end": FROZEN_NOW + 3600})]}
            message = summary(status, FROZEN_NOW, ZoneInfo("Asia/Shanghai"))  # 15:30 UTC is 23:30 there
        finally:
            monkeypatch.undo()
            time.tzset()
        assert message.title == "Board at 23:30 (Asia/Shanghai): 0 of 1 cards free"
        assert message.lines == ("GPU 0: BOOKED, 1.0/31.8 GiB, 0 % busy, bob until Mon 00:30",)


class TestSecrets:
    def target(self, url: str):
        from app.config import NotifyTarget

        return NotifyTarget("ops", "webhook", url)

    def test_a_target_is_named_by_name_type_and_host(self):
        from app.notify.deliver import describe

        assert describe(self.target("https://user:SEKRIT1@hooks.example:8443/T0/SEKRIT2?key=SEKRIT3")) == \
            "ops (webhook, hooks.example:8443)"

    def test_redact_removes_every_secret_part_of_the_url(self):
        from app.notify.deliver import redact

        url = "https://bot:SEKRIT1@hooks.example/services/SEKRIT2?key=SEKRIT3&x=1"
        said = redact(f"failed {url} path /services/SEKRIT2 key SEKRIT3 user bot:SEKRIT1\nmore", self.target(url))
        assert "SEKRIT" not in said and "\n" not in said and said.startswith("failed <secret>")


# The formats and the summary at their boundaries: where `make mutation` found a nearly right version untold apart.

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
def new_york(set_tz):
    """The service's own zone differs from the policy zone the summary is given."""
    set_tz("America/New_York")


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
