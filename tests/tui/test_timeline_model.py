"""The timeline's model without Textual (app.tui.timeline_model): which booking is where, the cursor and the
selection, the zoom, and the words of the pools' rules rows. The widget that draws it is tested in
test_tui_behaviour, test_tui_rules and the snapshots."""

from __future__ import annotations

import pytest

from app.config import ClassWindow, Pool
from app.model import Booking
from app.tui.timeline_model import TimelineModel, default_window, rule_words
from tests.tui.conftest import FROZEN_NOW, HOUR, simulated

CARDS = simulated().read().cards  # eight, GPU-...0 to 7
DAY_VIEW_START = FROZEN_NOW - 2 * HOUR  # 13:30: the day view opens two hours back, in 30-minute columns


def booking(id: int, cards: tuple[int, ...], start: int, end: int, user: str = "bob", status: str = "booked",
            notice: str | None = None) -> Booking:
    return Booking(id, user, 1002, cards, tuple(CARDS[c].uuid for c in cards), start, end, "batch", "", status,
                   notice=notice)


def model(*bookings: Booking, pools: tuple[Pool, ...] = ()) -> TimelineModel:
    timeline = TimelineModel("alice", FROZEN_NOW, pools=pools)
    timeline.set_cards(CARDS)
    timeline.set_bookings(bookings)
    return timeline


def test_the_model_imports_without_textual():
    """Pure logic the TUI alone uses lives in app/tui, but must not need Textual (STYLE.md, layering)."""
    from tests.unit.test_import_hygiene import loaded_after

    loaded = loaded_after("import app.tui.timeline_model")
    assert "app.tui.timeline_model" in loaded and "textual" not in loaded


class TestGrid:
    def test_a_booking_owns_the_columns_it_touches_on_each_of_its_cards(self):
        b = booking(1, (2, 3), FROZEN_NOW + 600, FROZEN_NOW + HOUR + 600)  # 15:40-16:40: columns 4 to 6
        timeline = model(b)
        assert (timeline.view_start, timeline.view_end) == (DAY_VIEW_START, DAY_VIEW_START + 24 * HOUR)
        assert [c for c in range(48) if timeline.booking_at(2, c) is b] == [4, 5, 6]
        assert [timeline.booking_at(r, 5) for r in range(8)] == [None, None, b, b, None, None, None, None]

    def test_the_earlier_booking_keeps_a_shared_column_and_cancelled_ones_are_not_drawn(self):
        first = booking(1, (0,), DAY_VIEW_START, DAY_VIEW_START + 2700)  # 13:30-14:15
        second = booking(2, (0,), DAY_VIEW_START + 2700, DAY_VIEW_START + 2 * HOUR)  # 14:15-15:30
        gone = booking(3, (1,), DAY_VIEW_START, DAY_VIEW_START + HOUR, status="cancelled")
        timeline = model(first, second, gone)
        assert [timeline.booking_at(0, c) for c in range(5)] == [first, first, second, second, None]
        assert timeline.booking_at(1, 0) is None

    def test_bookings_outside_the_view_are_not_drawn_and_the_edges_clip(self):
        before = booking(1, (0,), DAY_VIEW_START - HOUR, DAY_VIEW_START)  # ends as the view starts
        across = booking(2, (1,), DAY_VIEW_START - HOUR, DAY_VIEW_START + 1800)
        timeline = model(before, across)
        assert all(timeline.booking_at(0, c) is None for c in range(48))
        assert [c for c in range(48) if timeline.booking_at(1, c) is across] == [0]

    def test_the_block_label_is_on_its_top_row_only(self):
        b = booking(1, (2, 3), FROZEN_NOW, FROZEN_NOW + HOUR, user="bob", notice="moved by admin erin")
        timeline = model(b)
        assert timeline.block_label(b, 2, 4) == "⚑ bob ×2"
        assert timeline.block_label(b, 3, 4) == ""

    def test_the_default_window_is_the_one_the_board_loads_first(self):
        assert default_window(FROZEN_NOW) == (model().view_start, model().view_end)


class TestCursor:
    def test_moving_past_the_right_edge_moves_the_time_shown_and_the_selection_keeps_its_start(self):
        timeline = model()
        timeline.move_cursor(4, 46, extend=False, visible_rows=8)
        moved = timeline.move_cursor(4, 47, extend=True, visible_rows=8)
        assert not moved.view and timeline.anchor == (4, 46)
        moved = timeline.move_cursor(4, 48, extend=True, visible_rows=8)
        assert moved.view and timeline.view_start == DAY_VIEW_START + 1800
        assert timeline.cursor == (4, 47) and timeline.anchor == (4, 45)  # the same times as before
        assert timeline.selected_range() == ([4], DAY_VIEW_START + 46 * 1800, DAY_VIEW_START + 49 * 1800)

    def test_rows_scroll_to_keep_the_cursor_visible(self):
        timeline = model()
        assert timeline.move_cursor(5, 4, extend=False, visible_rows=3).scrolled
        assert timeline.row_offset == 3
        assert not timeline.move_cursor(4, 4, extend=False, visible_rows=3).scrolled
        assert timeline.move_cursor(1, 4, extend=False, visible_rows=3).scrolled and timeline.row_offset == 1
        assert timeline.move_cursor(99, 4, extend=False, visible_rows=3).rows >= {1, 7}  # clamped to the last card
        assert timeline.cursor == (7, 4)

    def test_a_move_repaints_the_old_and_the_new_selection(self):
        timeline = model()
        timeline.move_cursor(2, 4, extend=False, visible_rows=8)
        timeline.move_cursor(4, 4, extend=True, visible_rows=8)
        assert timeline.move_cursor(5, 4, extend=False, visible_rows=8).rows == {2, 3, 4, 5}
        assert timeline.anchor is None

    def test_space_marks_a_selection_that_plain_moves_grow(self):
        timeline = model()
        timeline.move_cursor(1, 10, extend=False, visible_rows=8)
        timeline.mark()
        timeline.move_cursor(2, 12, extend=False, visible_rows=8)
        assert timeline.selection() == (1, 2, 10, 12)
        timeline.mark()  # ends marking; the selection stays until a plain move
        timeline.move_cursor(2, 13, extend=False, visible_rows=8)
        assert timeline.selection() is None

    def test_a_click_without_a_drag_selects_nothing_and_a_drag_does(self):
        timeline = model()
        timeline.press(3, 6, visible_rows=8)
        timeline.release()
        assert timeline.anchor is None and timeline.cursor == (3, 6)
        timeline.press(3, 6, visible_rows=8)
        timeline.move_cursor(4, 8, extend=True, visible_rows=8)
        timeline.release()
        assert timeline.selected_range() == ([3, 4], DAY_VIEW_START + 6 * 1800, DAY_VIEW_START + 9 * 1800)

    def test_no_cards_no_cursor(self):
        timeline = TimelineModel("alice", FROZEN_NOW)
        assert timeline.move_cursor(1, 1, extend=False, visible_rows=8) is None
        assert timeline.selected_range() is None


class TestZoom:
    def test_a_zoom_keeps_the_cursors_time_in_view(self):
        timeline = model()
        timeline.move_cursor(0, 40, extend=False, visible_rows=8)  # 09:30 tomorrow
        focus = timeline.column_time(40)
        timeline.set_zoom(0)  # hours: 6 h from 14:30, without tomorrow morning: a view a quarter in
        assert timeline.zoom.name == "hours" and timeline.view_start <= focus < timeline.view_end
        assert timeline.column_time(timeline.cursor[1]) == focus and timeline.cursor[1] == 9
        timeline.set_zoom(1)  # the day view holds it: the default view
        assert timeline.view_start == DAY_VIEW_START and timeline.cursor == (0, 40)

    def test_now_goes_back_to_the_default_view_and_drops_the_selection(self):
        timeline = model()
        timeline.move_cursor(0, 40, extend=True, visible_rows=8)
        timeline.scroll_time(86400)
        timeline.jump_to_now()
        assert (timeline.view_start, timeline.cursor, timeline.anchor) == (DAY_VIEW_START, (0, 4), None)

    def test_now_moving_into_the_next_column_is_told(self):
        timeline = model()
        assert not timeline.set_now(FROZEN_NOW + 1799)
        assert timeline.set_now(FROZEN_NOW + 1800)


class TestPools:
    PROD = Pool("prod", (0, 1, 2, 3), classes=("online", "batch", "finetune"),
                windows={"finetune": ClassWindow(19 * 60, 9 * 60)})
    LAB = Pool("lab", (4, 5, 6, 7), max_hours=12)

    def test_each_pool_with_cards_has_a_rules_row_and_its_cards_know_it(self):
        timeline = model(pools=(self.PROD, self.LAB, Pool("empty", (42,))))
        assert timeline.pool_rows == [0, 1]
        assert [timeline.pool_of(r).name for r in (0, 3, 4, 7)] == ["prod", "prod", "lab", "lab"]
        # Sunday 13:30: finetune open all weekend; Monday 09:00 (column 39) it closes until 19:00.
        assert timeline.allowed[0][38] == ("online", "batch", "finetune")
        assert timeline.allowed[0][39] == ("online", "batch")
        assert timeline.allowed[1][39] == ("online", "batch", "finetune", "experiment")

    @pytest.mark.parametrize("room, words", [
        (30, "online batch finetune"), (20, "on ba ft"), (8, "on ba ft"), (7, "obf"), (2, ""),
    ])
    def test_the_rules_shorten_to_fit(self, room, words):
        assert "".join(text for text, _ in rule_words(self.PROD, ("online", "batch", "finetune"), room)) == words

    def test_the_rules_name_any_class_a_cap_and_closed(self):
        assert rule_words(self.LAB, ("online", "batch", "finetune", "experiment"), 20) == [
            ("any class", "rule"), (" ≤12h", "rule")]
        assert rule_words(self.LAB, ("online", "batch", "finetune", "experiment"), 6) == [("any", "rule")]
        assert rule_words(self.PROD, (), 10) == [("closed", "rule")]
        assert rule_words(self.PROD, ("online", "finetune"), 30) == [
            ("online", "rule-online"), (" ", "rule"), ("finetune", "rule-finetune")]


def test_labels_shorten_to_fit_and_leave_room_for_a_pools_name():
    timeline = TimelineModel("alice", FROZEN_NOW, pools=(Pool("production", (0,)),))
    assert timeline.set_cards(CARDS[:2])
    assert [r.label for r in timeline.rows] == ["0", "1"] and timeline.label_width == 9  # "producti" and a space
    assert timeline.set_cards(CARDS[:2], {0: "rack-A slot 0 SN-77310"})
    assert timeline.rows[0].label == "0 rac…10" and timeline.label_width == 9
    assert not timeline.set_cards(CARDS[:2], {0: "rack-A slot 0 SN-77310"})  # nothing changed
    assert timeline.set_cards(CARDS[:2], {0: "rack-A slot 0 SN-77310"}, wide=True)
    assert timeline.rows[0].label == "0 rack…7310" and timeline.label_width == 12


def test_with_another_hosts_cards_every_row_names_its_host():
    """Issue 31 §8: on a fleet of several hosts this host's rows read '0'..'7' beside 'gpu2:0': whose card is it?"""
    timeline = TimelineModel("alice", FROZEN_NOW)
    timeline.set_cards(CARDS[:2], here="gpu1")  # one host: plain indices, as ever
    assert [r.label for r in timeline.rows] == ["0", "1"]
    timeline.set_cards(CARDS[:2] * 2, hosts=[None, None, "gpu2", "gpu2"], here="gpu1")
    assert [(r.label, r.host) for r in timeline.rows] == [("gpu1:0", None), ("gpu1:1", None), ("gpu2:0", "gpu2"),
                                                          ("gpu2:1", "gpu2")]  # the host of a row is still None here
    timeline.set_cards(CARDS[:2] * 2, {0: "rack-A"}, hosts=[None, None, "gpu2", "gpu2"], here="gpu1")
    assert timeline.rows[0].label == "gpu1:0" and timeline.label_width == 9  # the host before the label


class TestAllocations:
    """A project's allocation windows ([[projects]], app.core.projects.allocation_spans) on the grid: which card
    rows they hold in which columns, and the projects' rows. The day view opens Sunday 13:30 (UTC) for 24 h."""

    @staticmethod
    def config(*projects):
        from app.config import Config

        return Config(pools=(Pool("prod", (0, 1, 2, 3)),), projects=projects)

    @staticmethod
    def project(name: str, *allocations, members=("alice",)):
        from app.config import Project

        return Project(name, members, allocations=tuple(allocations))

    def held(self, *projects) -> TimelineModel:
        from app.config import ProjectAllocation as Allocation

        config = self.config(
            self.project("A", Allocation(pool="prod", hours="09:00-19:00", days="mon-fri")),
            self.project("B", Allocation(cards=(6, 7, 9), hours="18:00-22:00", days="sun")),  # no card 9 here
            self.project("C"),  # no allocation: no row
            self.project("D", Allocation(cards=(9,))),  # no such card here: no row
            *projects)
        timeline = TimelineModel("alice", FROZEN_NOW, projects=config)
        timeline.set_cards(CARDS)
        timeline.set_bookings(())
        return timeline

    def test_each_window_holds_its_cards_rows_over_its_hours_and_no_others(self):
        """Wrong versions: the closing column held too (19:00 on Monday is column 47's end, 22:00 Sunday column 17's
        start), the opening one not; every card row shaded; a weekday window drawn on Sunday; a card the fleet
        has not (9) said to be held."""
        timeline = self.held()
        assert timeline.project_rows == ["A", "B"]
        a = [c for c in range(48) if (h := timeline.held_at(0, c)) is not None and h.project == "A"]
        assert a == list(range(39, 48))  # Monday 09:00 to the view's end, 13:30
        assert [c for c in range(48) if timeline.held_at(6, c) is not None] == list(range(9, 17))  # Sunday 18-22
        assert all(timeline.held_at(r, c) is None for r in (4, 5) for c in range(48))
        assert {timeline.held_at(r, 40).project for r in range(4)} == {"A"}
        assert timeline.holding[0][39] == (0, 1, 2, 3) and timeline.holding[0][38] == ()
        assert timeline.holding[1][9] == (6, 7) and timeline.holding[1][17] == ()

    def test_a_booking_on_held_cells_is_drawn_over_them(self):
        timeline = self.held()
        b = booking(1, (6,), FROZEN_NOW + 3 * HOUR, FROZEN_NOW + 4 * HOUR)  # 18:30-19:30, in B's window
        timeline.set_bookings((b,))
        assert timeline.booking_at(6, 10) is b and timeline.held_at(6, 10).project == "B"

    def test_a_board_without_projects_has_no_project_rows_and_nothing_held(self):
        timeline = model()
        assert timeline.project_rows == [] and all(h is None for row in timeline.held for h in row)

    def test_another_hosts_card_of_the_same_index_is_not_held(self):
        """Allocations name this host's cards: gpu2's card 0 is not project A's."""
        timeline = TimelineModel("alice", FROZEN_NOW, projects=self.held().projects)
        timeline.set_cards([*CARDS, CARDS[0]], hosts=[*[None] * 8, "gpu2"], here="gpu1")
        timeline.set_bookings(())
        assert timeline.held_at(0, 40) is not None and timeline.held_at(8, 40) is None


def test_held_words_shorten_to_fit():
    from app.tui.timeline_model import held_words

    cards = (0, 1, 2, 3, 6)
    assert [held_words(cards, room) for room in (30, 17, 16, 11, 10, 5, 4)] == [
        "holds cards 0-3,6", "holds cards 0-3,6", "cards 0-3,6", "cards 0-3,6", "0-3,6", "0-3,6", ""]
    assert held_words((), 30) == ""
