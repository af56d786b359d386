"""Issue 11 §7, the board shows the rules: pools shaded and their windows on the timeline, active bookings
among the upcoming ones, labels abbreviated at 80x24 (in full in `board status`), and the demo's plan."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest
from msgspec import structs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.cells import cell_len

from app.config import CLASSES, ClassWindow, Config, Pool
from app.core.cardstate import BOOKED, FREE, IN_USE, SQUATTED, fleet_status
from app.core.policy import card_refusal, open_classes, pool_rules
from app.demo import DEMO_POOLS, PROD, demo_config, seed_if_empty
from app.output import status_text
from app.store import bookings as rows
from app.store.db import connect
from app.tui.render import abbreviate
from app.tui.timeline_model import TimelineModel
from app.tui.widgets.upcoming import UpcomingTable
from tests.conftest import FROZEN_NOW, run_board
from tests.tui.conftest import BASE, HOUR, ready, simulated, wait_for

DEMO = demo_config(Config())
LABELS = {i: f"rack-A slot {i} SN-7731{i}" for i in range(8)}
DAY_S = 86400
FINETUNE_AT_NIGHT = ClassWindow(19 * 60, 9 * 60, weekends=True)  # prod's in the demo and docs/configuration.md


def background(strip, x: int):
    """The background colour of the cell at column x of a rendered line."""
    for segment in strip:
        if x < cell_len(segment.text):
            return segment.style.bgcolor if segment.style else None
        x -= cell_len(segment.text)
    raise IndexError(x)


def detail_text(app) -> str:
    return str(app.board.query_one("#detail").render())


class TestPoolsOnTheTimeline:
    async def test_each_pool_has_a_rules_row_naming_what_it_takes_and_when(self, make_app):
        app = make_app(config=DEMO)
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            timeline = app.board.timeline
            assert timeline.axis_rows == 4  # the time axis, then prod and lab
            lw = timeline.model.label_width
            prod, lab = timeline.render_line(2).text, timeline.render_line(3).text
            # Sunday 15:30, a view from 13:30: finetune is open all weekend and closes Monday 09:00 (column 39).
            assert prod[:lw] == "prod ".ljust(lw) and lab[:lw] == "lab".ljust(lw)
            assert prod[lw + 4] == "│"  # now
            assert prod[lw + 5:].startswith("online batch finetune")
            assert prod[lw + 39] == "▏" and prod[lw + 40:].startswith("on ba ")  # too narrow for the names
            assert lab[lw + 5:].startswith("any class ≤12h")
            assert set(prod[lw:lw + 4]) == {" "}  # nothing said about the past

    async def test_the_week_view_marks_each_window_opening_and_closing(self, make_app):
        app = make_app(config=DEMO)
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            await pilot.press("z")
            timeline = app.board.timeline
            assert timeline.model.zoom.name == "week"
            prod = timeline.render_line(2).text[timeline.model.label_width:]
            marks = [timeline.model.column_time(x // timeline.cell_width) for x, ch in enumerate(prod) if ch == "▏"]
            # Weekdays close at 09:00 and reopen with the first whole 3 h column after 19:00 (21:00);
            # the weekend stays open from Friday night to Monday morning.
            hours = [(datetime.fromtimestamp(t, timezone.utc).strftime("%a %H")) for t in marks]
            assert hours == ["Mon 09", "Mon 21", "Tue 09", "Tue 21", "Wed 09", "Wed 21", "Thu 09", "Thu 21", "Fri 09",
                             "Fri 21"]

    async def test_pool_cards_and_their_rules_row_are_shaded_alike_and_apart_from_other_pools(self, make_app):
        config = structs.replace(DEMO, pools=(DEMO.pools[0],))  # prod only: cards 4-7 are in no pool
        app = make_app(config=config)
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            timeline = app.board.timeline
            assert timeline.axis_rows == 3
            future = timeline.model.label_width + 30  # a free cell on cards 3 and 4 (Monday 04:30)
            rule_row, card3, card4 = (timeline.render_line(2 + n) for n in (0, 1 + 3, 1 + 4))
            assert background(card3, 0) == background(rule_row, 0) == background(card3, future)
            assert background(card4, 0) != background(card3, 0)
            assert background(card4, future) != background(card3, future)

        app = make_app(config=DEMO)
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            timeline = app.board.timeline
            card3, card4 = timeline.render_line(4 + 3), timeline.render_line(4 + 4)
            assert background(card3, 0) != background(card4, 0) and background(card4, 0) is not None

    async def test_a_free_cell_on_a_pool_card_tells_the_pools_rules(self, make_app):
        app = make_app(config=DEMO)
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            await pilot.press("tab", "down", "down", "down", *["right"] * 5)  # card 3 at 18:00, after carol
            assert detail_text(app) == ("card 3 free at 18:00 · prod: online, batch, finetune 19:00-09:00 and weekends"
                                        " · b books")
            await pilot.press("down")  # card 4, lab
            assert detail_text(app) == "card 4 free at 18:00 · lab: any class, ≤12 h · b books"

    async def test_clicks_land_on_the_card_below_the_rules_rows(self, make_app):
        app = make_app(config=DEMO)
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            timeline = app.board.timeline
            x = timeline.model.label_width + 6 * timeline.cell_width  # 16:30
            await pilot.mouse_down(timeline, offset=(x, timeline.axis_rows + 4))
            await pilot.mouse_up(timeline, offset=(x, timeline.axis_rows + 4))
            assert timeline.model.cursor == (4, 6)
            await pilot.mouse_down(timeline, offset=(x, 2))  # a rules row is no card
            assert timeline.model.cursor == (4, 6)

    async def test_without_pools_the_timeline_has_no_rules_rows(self, make_app):
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            timeline = app.board.timeline
            assert timeline.axis_rows == 2 and timeline.render_line(2).text.startswith("0 ")
            await pilot.press("tab", "down", "down", "down", *["right"] * 5)
            assert "shift+arrows or drag to select" in detail_text(app)


class TestWindowsAgreeWithThePolicy:
    """What the rules row shows open, the service accepts: a booking of exactly that column passes."""

    # mutmut runs these in one process more than once, each time on a new instance of the class
    SAME_TEST_NEW_INSTANCE = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.differing_executors])

    @SAME_TEST_NEW_INSTANCE
    @given(start=st.integers(0, 24 * 60), end=st.integers(0, 24 * 60), weekends=st.booleans(),
           zone=st.sampled_from([None, "Europe/Berlin", "Asia/Kolkata"]))
    def test_a_day_view_column_is_open_exactly_when_a_booking_of_it_passes(self, start, end, weekends, zone):
        tz = ZoneInfo(zone) if zone else None
        pool = Pool("p", (0,), windows={"finetune": ClassWindow(start, end, weekends)})
        config = Config(pools=(pool,))
        for column in range(7 * 48):  # every half-hour column of a week, in UTC (the tests' zone)
            t = BASE + column * 1800
            shown = "finetune" in open_classes(pool, t, t + 1800, tz)
            accepted = card_refusal(config, 0, "finetune", t, t + 1800, tz) is None
            # Exactly, also where a window's edge cuts the column: both read as closed.
            assert shown == accepted, datetime.fromtimestamp(t, timezone.utc)

    def test_the_timeline_shows_the_policys_answer_across_a_clock_change(self):
        """Berlin's clocks go back at 03:00 on 25 Oct 2026: the 3 h column from 02:00 CEST lasts until 04:00 CET,
        inside a 23:33-04:36 window, so the policy accepts it. Counting wall minutes (02:00 + 3 h = 05:00) would
        read it closed: the timeline asks the policy rather than reckon windows itself."""
        berlin = ZoneInfo("Europe/Berlin")
        pool = Pool("p", (0,), windows={"finetune": ClassWindow(23 * 60 + 33, 4 * 60 + 36, weekends=False)})
        t = int(datetime(2026, 10, 25, 2, 0, tzinfo=berlin).timestamp())
        assert card_refusal(Config(pools=(pool,)), 0, "finetune", t, t + 3 * HOUR, berlin) is None
        timeline = TimelineModel("alice", t, pools=(pool,), zone=berlin)
        timeline.set_cards(simulated().read().cards[:1])
        timeline.set_zoom(2)  # the week: 3 h columns
        assert "finetune" in timeline.allowed[0][timeline.column_of(t)]

    @SAME_TEST_NEW_INSTANCE
    @given(start=st.integers(0, 24 * 60), end=st.integers(0, 24 * 60), weekends=st.booleans(),
           zone=st.sampled_from([None, "Europe/Berlin", "America/St_Johns"]))
    def test_a_week_view_column_shown_open_always_passes(self, start, end, weekends, zone):
        tz = ZoneInfo(zone) if zone else None
        pool = Pool("p", (0,), windows={"finetune": ClassWindow(start, end, weekends)})
        for column in range(7 * 8):  # 3 h columns; St John's is 3:30 off, so its columns cross midnight
            t = BASE - BASE % (3 * HOUR) + column * 3 * HOUR
            if "finetune" in open_classes(pool, t, t + 3 * HOUR, tz):
                assert card_refusal(Config(pools=(pool,)), 0, "finetune", t, t + 3 * HOUR, tz) is None

    @pytest.mark.parametrize("zone", [None, "Europe/Berlin"])
    def test_the_demo_window_in_a_week_of_day_columns(self, zone):
        """Prod's finetune window, column by column: the example in docs/configuration.md, read where the policy reads it."""
        tz = ZoneInfo(zone) if zone else None
        pool = DEMO_POOLS[0]
        opened = [datetime.fromtimestamp(BASE + c * 1800, tz).strftime("%a %H:%M") for c in range(1, 7 * 48)
                  if ("finetune" in open_classes(pool, BASE + c * 1800, BASE + (c + 1) * 1800, tz))
                  != ("finetune" in open_classes(pool, BASE + (c - 1) * 1800, BASE + c * 1800, tz))]
        assert opened == ["Mon 09:00", "Mon 19:00", "Tue 09:00", "Tue 19:00", "Wed 09:00", "Wed 19:00", "Thu 09:00",
                          "Thu 19:00", "Fri 09:00", "Fri 19:00"]

    def test_a_class_the_pool_does_not_take_is_never_shown(self):
        pool = DEMO_POOLS[0]
        assert all("experiment" not in open_classes(pool, BASE + h * HOUR, BASE + (h + 1) * HOUR, None)
                   for h in range(24 * 7))

    @pytest.mark.parametrize("pool, words", [
        (DEMO_POOLS[0], "online, batch, finetune 19:00-09:00 and weekends"),
        (DEMO_POOLS[1], "any class, ≤12 h"),
        (Pool("x", (0,), classes=("online",), max_hours=1.5), "online, ≤1.5 h"),
        (Pool("y", (0,), windows={"batch": ClassWindow(0, 360, weekends=False)}),
         "online, batch 00:00-06:00, finetune, experiment"),
    ])
    def test_pool_rules_in_words(self, pool, words):
        assert pool_rules(pool) == words


class TestUpcoming:
    async def test_active_bookings_come_first_with_the_time_they_have_left(self, make_app):
        app = make_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            table = app.board.query_one(UpcomingTable)
            await wait_for(pilot, lambda: table.row_count == 6)
            when = [(str(table.get_row_at(n)[0]), str(table.get_row_at(n)[6])) for n in range(table.row_count)]
            # alice 13:00-19:00, bob until Monday 15:00 and carol until 17:00 are on now; erin starts at 17:00.
            assert when[:4] == [("2", "23h30m left"), ("1", "3h30m left"), ("3", "1h30m left"), ("4", "in 1h30m")]
            assert app.board.query_one("#upcoming-title").render().plain == "Active and upcoming bookings"

    async def test_time_left_counts_down_and_an_ended_booking_leaves(self, make_app):
        now = [float(FROZEN_NOW)]
        app = make_app(clock=lambda: now[0])
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            table = app.board.query_one(UpcomingTable)
            await wait_for(pilot, lambda: table.row_count == 6)
            now[0] = BASE + 4 * HOUR + 60  # 19:01: alice's and carol's are over, erin's is on
            await wait_for(pilot, lambda: table.row_count == 4)
            assert [str(table.get_row_at(n)[0]) for n in range(4)] == ["2", "4", "5", "6"]
            assert str(table.get_row_at(1)[6]) == "1h59m left"


    async def test_a_board_grown_tall_builds_the_table_then_and_fills_it(self, make_app):
        """At 80x24 the table is not built (the first paint needs none); made tall, the board builds it above the
        footer and fills it. Wrong versions this fails on: the table built at every size (composed as before); its mount
        not awaited, so the rows are added before its columns."""
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            assert not app.board.query(UpcomingTable) and not app.board.query("#upcoming-title")
            await pilot.resize_terminal(120, 40)
            await wait_for(pilot, lambda: bool(app.board.query(UpcomingTable)))
            table = app.board.query_one(UpcomingTable)
            await wait_for(pilot, lambda: table.row_count == 6)
            assert [str(column.label) for column in table.columns.values()][:3] == ["#", "USER", "CARDS"]
            assert [type(w).__name__ for w in app.board.children][-3:] == ["Static", "UpcomingTable", "BoardFooter"]


class TestLabels:
    async def test_at_80x24_labels_are_abbreviated_and_the_holder_column_stays(self, make_app):
        app = make_app(config=structs.replace(DEMO, labels=LABELS))
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            cards = app.board.card_table
            keys = cards.column_keys
            assert "holder" in keys and cards.virtual_size.width <= cards.size.width  # no column off screen
            assert str(cards.get_row_at(0)[keys.index("holder")]) == "alice→19:00"
            timeline = app.board.timeline
            labels = [timeline.render_line(timeline.axis_rows + n).text[:timeline.model.label_width] for n in range(8)]
            # The index whole, then the label's start and its end (the serial), in the gutter.
            assert labels == [f"{n} rac…1{n}".ljust(timeline.model.label_width) for n in range(8)]

    async def test_at_a_wide_size_labels_get_more_room(self, make_app):
        app = make_app(config=structs.replace(DEMO, labels=LABELS))
        async with app.run_test(size=(140, 40)) as pilot:
            await ready(pilot)
            timeline = app.board.timeline
            assert timeline.render_line(timeline.axis_rows + 3).text.startswith("3 rack…7313 ")
            assert str(app.board.card_table.get_row_at(3)[0]) == "3 rac…13"

    @pytest.mark.parametrize("text, width, short", [
        ("slot 3", 6, "slot 3"),
        ("rack-A slot 3 SN-77313", 9, "rack…7313"),
        ("rack-A slot 3 SN-77313", 2, "r…"),
        ("rack-A slot 3 SN-77313", 1, "…"),
        ("rack-A slot 3 SN-77313", 0, ""),
        ("机位三号卡槽", 7, "机…卡槽"),  # wide characters count two cells
    ])
    def test_abbreviate(self, text, width, short):
        assert abbreviate(text, width) == short and cell_len(short) <= width

    def test_board_status_prints_each_label_in_full(self, tmp_path):
        from app.client.local import LocalClient
        from app.core.identity import Identity

        config = Config(db_path=tmp_path / "board.db", labels={3: LABELS[3]})
        client = LocalClient.on(config, simulated(), Identity("alice", 1001, False), clock=lambda: FROZEN_NOW)
        lines = status_text(client.call("status"), FROZEN_NOW).splitlines()
        assert lines[1].split()[:3] == ["#", "LABEL", "STATE"]
        assert lines[2 + 3].startswith(f"3  {LABELS[3]}  ") and lines[2 + 0].split()[1] == "-"

    def test_board_status_without_labels_has_no_label_column(self, tmp_path):
        from app.client.local import LocalClient
        from app.core.identity import Identity

        config = Config(db_path=tmp_path / "board.db")
        client = LocalClient.on(config, simulated(), Identity("alice", 1001, False), clock=lambda: FROZEN_NOW)
        assert status_text(client.call("status"), FROZEN_NOW).splitlines()[1].split()[:2] == ["#", "STATE"]


def demo_bookings(now: float) -> list[rows.Booking]:
    conn = connect(":memory:")
    seed_if_empty(conn, simulated().read().cards, now)
    return rows.listing(conn, start=None, end=None, user=None, include_cancelled=True)


# Sunday afternoon, Monday before the online day, Wednesday noon, Friday evening, Saturday night.
SEEDED_AT = [FROZEN_NOW, BASE + 17 * HOUR, BASE + 3 * DAY_S - 3 * HOUR, BASE + 5 * DAY_S + 4 * HOUR + 1800,
             BASE - 12 * HOUR]


class TestDemo:
    @pytest.mark.parametrize("now", SEEDED_AT)
    def test_prod_serves_online_on_weekday_days_and_finetunes_the_rest(self, now):
        found = demo_bookings(now)
        prod = sorted((b for b in found if set(b.cards) & set(PROD)), key=lambda b: b.start)
        assert all(b.cards == PROD for b in prod)  # one TP4 group
        for b in prod:
            start, end = (datetime.fromtimestamp(t, timezone.utc) for t in (b.start, b.end))
            if b.klass == "online":
                assert start.weekday() < 5 and (start.hour, end.hour, b.end - b.start) == (9, 19, 10 * HOUR)
            else:
                assert b.klass == "finetune" and (start.hour, end.hour) == (19, 9)
                assert end.weekday() == 0 if start.weekday() == 4 else (end - start).days == 0
        # Never idle: each booking ends where the next starts, from before now to a week ahead.
        assert prod[0].start <= now and prod[-1].end >= now + 7 * DAY_S
        assert all(a.end == b.start for a, b in zip(prod, prod[1:]))

    @pytest.mark.parametrize("now", SEEDED_AT)
    def test_every_booking_keeps_the_demo_pools_and_none_overlap(self, now):
        found = demo_bookings(now)
        for b in found:
            assert b.end - b.start <= DEMO.policy.max_booking_hours * HOUR
            assert [card_refusal(DEMO, c, b.klass, b.start, b.end) for c in b.cards] == [None] * len(b.cards)
        for card in range(8):
            spans = sorted((b.start, b.end) for b in found if card in b.cards)
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
        assert {b.klass for b in found if set(b.cards) <= {4, 5, 6, 7}} >= {"experiment"}

    def test_every_card_state_shows_whenever_the_demo_is_seeded(self):
        source = simulated()
        snapshot = source.read()
        for hour in range(0, 7 * 24, 1):
            now = BASE + hour * HOUR + 1800
            live = [b for b in demo_bookings(now) if b.end > now]
            states = {s.state for s in fleet_status(snapshot, live, now)}
            assert {FREE, BOOKED, IN_USE, SQUATTED} <= states, datetime.fromtimestamp(now, timezone.utc)

    def test_a_config_with_its_own_pools_keeps_them(self):
        own = Config(pools=(Pool("all", tuple(range(8))),))
        assert demo_config(own) is own and demo_config(Config()).pools == DEMO_POOLS
        assert {c for pool in DEMO_POOLS for c in pool.cards} == set(range(8))
        assert set(DEMO_POOLS[1].classes) == set(CLASSES)

    def test_board_demo_keeps_the_demo_pools(self, tmp_path):
        """The demo's service applies the pools its board shows: 13 h on a lab card is refused (exit 4)."""
        start = datetime.fromtimestamp(time.time() + 10 * DAY_S).strftime("%Y-%m-%d 10:00")  # past the seeded plan
        env = {"XDG_STATE_HOME": str(tmp_path / "state"), "TZ": "UTC"}
        too_long = run_board("--demo", "book", "--cards", "7", "--start", start, "--for", "13h", env=env)
        assert too_long.returncode == 4 and "lab" in too_long.stderr, too_long.stderr
