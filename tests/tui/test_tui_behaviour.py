"""Pilot tests: keys in, database rows and widgets out."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from dataclasses import replace

from msgspec import structs
from textual.widgets import Checkbox, Input, Static
from textual.widgets._toast import Toast

from app.core.identity import Identity
from app.gpu.simulated import DEFAULT_FLEET
from app.store import bookings as rows
from app.tui.keys import KEYS
from app.tui.screens.admin import AdminScreen
from app.core.parse import parse_cards
from app.tui.screens.booking_form import BookingModal, parse_form
from app.tui.screens.card_detail import CardDetailScreen
from app.tui.screens.confirm import ConfirmModal, describe
from app.tui.screens.help import HelpModal
from app.tui.screens.my_bookings import MyBookingsScreen
from tests.conftest import FROZEN_NOW, run_board
from tests.tui.conftest import (ALICE, BASE, ERIN_ADMIN, HOUR, HOSTILE_NOTE, HOSTILE_USER, measured, ready, seed, simulated,
                                wait_for)

import pytest


def bookings(db_path) -> list[rows.Booking]:
    conn = sqlite3.connect(db_path)
    try:
        return rows.listing(conn, start=None, end=None, user=None, include_cancelled=True)
    finally:
        conn.close()


def event_count(db_path) -> int:
    conn = sqlite3.connect(db_path)
    try:
        return conn.execute("SELECT count(*) FROM events").fetchone()[0]
    finally:
        conn.close()


async def erase(pilot, n: int = 30) -> None:
    await pilot.press(*["backspace"] * n)


class TestBookingForm:
    async def test_book_with_keys_only(self, make_app, seeded_db):
        app = make_app(live=True)  # end to end: keys in, the booking through the service, the real pollers
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            await pilot.press("down", "down", "down", "down", "b")  # card 4 is free until Monday
            await wait_for(pilot, lambda: isinstance(app.screen, BookingModal))
            form = app.screen
            assert form.query_one("#cards", Input).value == "4"  # from the highlighted row
            assert app.focused.id == "cards"
            await pilot.press("tab", "tab", "tab")  # count, model, start (context and parallel wait for a model)
            assert app.focused.id == "start"
            await pilot.press("tab")  # or later
            assert app.focused.id == "or-later"
            await pilot.press("tab")  # duration
            await erase(pilot, 5)
            await pilot.press(*"3h")
            await pilot.press("tab", "tab", "tab", *"sweep 2")  # until, class, note
            await pilot.press("enter")
            await wait_for(pilot, lambda: not isinstance(app.screen, BookingModal))
        made = [b for b in bookings(seeded_db) if b.user == "alice" and b.cards == (4,)]
        assert len(made) == 1
        assert (made[0].start, made[0].end, made[0].klass, made[0].note) == (
            FROZEN_NOW, FROZEN_NOW + 3 * HOUR, "experiment", "sweep 2")

    async def test_the_form_opens_calm_with_focus_in_cards_and_a_refusal_turns_red_once_asked(self, make_app):
        """Issue 31 §8: opened on bob's card 2 the form showed a red refusal with focus in Start. It opens with focus
        in Cards and the refusal said quietly (no ✗, muted); an edit or Enter makes it the red refusal."""
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            await pilot.press("down", "down", "b")  # card 2 is bob's
            await wait_for(pilot, lambda: isinstance(app.screen, BookingModal) and app.screen.error is not None)
            form, message = app.screen, app.screen.query_one("#message", Static)
            assert app.focused.id == "cards"
            assert "booked by bob" in form.error
            assert message.has_class("-calm") and not message.has_class("-error")
            assert not str(message.render()).startswith("✗")
            await pilot.press("enter")  # asked: now it is a refusal
            await wait_for(pilot, lambda: message.has_class("-error"))
            assert str(message.render()).startswith("✗ ") and "booked by bob" in str(message.render())
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:  # an edit asks too
            await ready(pilot)
            await pilot.press("b")  # no card: nothing to say yet but which cards
            await wait_for(pilot, lambda: isinstance(app.screen, BookingModal) and app.screen.error is not None)
            message = app.screen.query_one("#message", Static)
            assert app.focused.id == "cards" and message.has_class("-calm")
            await pilot.press("2")
            await wait_for(pilot, lambda: message.has_class("-error") and "bob" in str(message.render()))

    async def test_conflict_shows_inline_error_and_writes_nothing(self, make_app, seeded_db):
        before, log_before = bookings(seeded_db), event_count(seeded_db)
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            await pilot.press("down", "down", "b")  # card 2 is bob's
            await wait_for(pilot, lambda: isinstance(app.screen, BookingModal))
            form = app.screen
            await pilot.press("enter")
            await wait_for(pilot, lambda: form.error is not None and "bob" in form.error)
            await pilot.pause(0.3)
            assert isinstance(app.screen, BookingModal)  # still open, showing why
            shown = str(form.query_one("#message", Static).render())
            assert "card 2 is booked by bob until Mon 15:00 (in 24 h) (booking 2)" in shown
        assert bookings(seeded_db) == before
        assert event_count(seeded_db) == log_before

    async def test_live_validation_shows_the_core_error_while_typing(self, make_app):
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            await pilot.press("down", "down", "down", "down", "b")
            await wait_for(pilot, lambda: isinstance(app.screen, BookingModal))
            form = app.screen
            await wait_for(pilot, lambda: "✓" in str(form.query_one("#message", Static).render()))
            assert app.focused.id == "cards"
            await fill(pilot, form, "start", "yesterday")
            await wait_for(pilot, lambda: form.error is not None and "can't read" in form.error)
            await fill(pilot, form, "start", "mon 10:00")  # frank has card 4 from 11:00
            await wait_for(pilot, lambda: form.error is not None and "frank" in form.error)

    async def test_next_free_slot_fills_the_earliest_start(self, make_app):
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            await pilot.press("down", "down", "b")  # bob holds card 2 until Monday 15:00
            await wait_for(pilot, lambda: isinstance(app.screen, BookingModal))
            form = app.screen
            await pilot.press("ctrl+n")
            await wait_for(pilot, lambda: form.query_one("#start", Input).value == "2026-11-30 15:00")
            await wait_for(pilot, lambda: form.error is None)

    async def test_booking_a_card_with_another_users_processes_toasts_the_note(self, make_app, seeded_db):
        app = make_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            await pilot.press(*["down"] * 5, "b")  # card 5: free now, dave's eval runs on it
            await wait_for(pilot, lambda: isinstance(app.screen, BookingModal))
            assert app.screen.query_one("#cards", Input).value == "5"
            await pilot.press("enter")
            await wait_for(pilot, lambda: not isinstance(app.screen, BookingModal))
            await wait_for(pilot, lambda: any(n.severity == "warning" for n in app._notifications))
            made = [b for b in bookings(seeded_db) if b.user == "alice" and b.cards == (5,)]
            assert len(made) == 1
            warnings = [(n.title, n.message) for n in app._notifications if n.severity == "warning"]
            assert warnings == [(f"Booking #{made[0].id}", "card 5 has dave's processes (8.8 GiB) now")]
            assert any(n.title == "Booked" for n in app._notifications)

    async def test_a_booking_without_notes_toasts_no_warning(self, make_app):
        app = make_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            await pilot.press(*["down"] * 4, "b", "enter")  # card 4: free, nothing runs on it
            await wait_for(pilot, lambda: any(n.title == "Booked" for n in app._notifications))
            assert [n for n in app._notifications if n.severity == "warning"] == []

    async def test_a_name_in_the_note_shows_as_typed(self, make_app, tmp_path):
        from app.gpu.model import GpuProcess

        marked = GpuProcess(47002, 3000, "m[b]al[/b]lory[link=http://evil.example/]", 4243, "python x.py")
        source = simulated(replace(DEFAULT_FLEET, processes=(*DEFAULT_FLEET.processes, (4, marked))))
        db = tmp_path / "marked.db"
        seed(db, source)
        app = make_app(source=source, db_path=db)
        async with app.run_test(size=(120, 40), notifications=True) as pilot:
            await ready(pilot)
            await pilot.press(*["down"] * 4, "b", "enter")  # card 4: free, the marked name's process on it
            warned = lambda: [t for t in app.screen.query(Toast) if t._notification.severity == "warning"]  # noqa: E731
            await wait_for(pilot, lambda: len(warned()) == 1)
            shown = warned()[0].render()
            # Markup would have eaten the tags (and made a link): they show as typed, unstyled.
            assert "card 4 has m[b]al[/b]lory[link=http://evil.example/]'s processes (2.9 GiB) now" in shown.plain
            title = len("Booking #7\n")
            assert [span for span in shown.spans if span.end > title] == []

    async def test_escape_cancels(self, make_app, seeded_db):
        before = bookings(seeded_db)
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            await pilot.press("b")
            await wait_for(pilot, lambda: isinstance(app.screen, BookingModal))
            await pilot.press("escape")
            await wait_for(pilot, lambda: not isinstance(app.screen, BookingModal))
        assert bookings(seeded_db) == before

    def test_parse_form(self):
        request = parse_form("4-5", "", "16:00", "", "18:30", "batch", "n", FROZEN_NOW)
        assert (request.cards, request.start, request.end, request.klass) == (
            (4, 5), BASE + HOUR, BASE + 3 * HOUR + 1800, "batch")
        assert parse_cards("0, 2-3") == [0, 2, 3]  # the one grammar of app.core.parse
        for cards, count, start, length, until, message in (
            ("", "", "now", "1h", "", "say which cards"),
            ("1", "2", "now", "1h", "", "not both"),
            ("1", "", "now", "1h", "18:00", "a duration or an end"),
            ("1", "", "now", "", "", "say how long"),
            ("x", "", "now", "1h", "", "can't read cards"),
        ):
            with pytest.raises(Exception, match=message):
                parse_form(cards, count, start, length, until, "batch", "", FROZEN_NOW)

    def test_the_form_and_the_extend_box_read_times_as_the_cli_does(self):
        from app.model import Booking
        from app.tui.screens.confirm import ExtendModal

        request = parse_form("4", "", "tonight", "", "tomorrow 7:00", "batch", "", FROZEN_NOW, night_start=20 * 60)
        assert (request.start, request.end) == (BASE + 5 * HOUR, BASE + 16 * HOUR)
        request = parse_form("0-1,4", "", "tomorrow 14:00", "", "tomorrow 16:00", "batch", "", FROZEN_NOW)
        assert (request.cards, request.end - request.start) == ((0, 1, 4), 2 * HOUR)  # not 26 hours
        with pytest.raises(Exception, match="the end Sun 29 Nov 16:00 is at or before the start Mon 30 Nov 14:00"):
            parse_form("4", "", "tomorrow 14:00", "", "today 16:00", "batch", "", FROZEN_NOW)
        ends_tomorrow_10 = Booking(1, "alice", 1001, (4,), ("GPU-4",), BASE + 17 * HOUR, BASE + 19 * HOUR, "batch", "",
                                   "booked")
        extend = ExtendModal(ends_tomorrow_10, FROZEN_NOW)
        assert extend._parse("9:00") == BASE + 42 * HOUR  # the first 09:00 after the current end
        assert extend._parse("+1h") == extend._parse("1h") == BASE + 20 * HOUR
        with pytest.raises(Exception, match="is at or before the current end Mon 30 Nov 10:00"):
            extend._parse("tomorrow 9:00")


# The model shapes for the form: tiny fits one card; heavy (about 100 MiB of F32 weights, 8 layers) needs two
# under HEAVY_FIT, where a card holds 700 MiB and the usual 500 MiB overhead: 648 MiB on one, 617 on each of two.
HEAVY = "heavy"
HEAVY_FIT = dict(card_mib=700)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.fit.shapes import Shape, write_model

    folder = tmp_path_factory.mktemp("models")
    (folder / "big").mkdir()
    write_model(folder / "tiny.gguf", "tiny")
    write_model(folder / "big" / f"{HEAVY}.gguf", Shape(HEAVY, n_embd=256, n_layer=8, n_head=4, n_head_kv=2, n_ff=4096))
    (folder / "README.txt").write_text("not a model")
    return folder


def model_config(model_dir):
    from app.config import Config, FitSettings, LlamaSettings

    return Config(llama=LlamaSettings(model_dirs=(str(model_dir),)), fit=FitSettings(**HEAVY_FIT))


def estimate(path, cards: int, **settings):
    """What app.fit says the model needs on `cards` cards under HEAVY_FIT: the figures the form must show."""
    from app.fit.estimate import Settings, place
    from app.fit.gguf_model import read_model
    from app.fit.request import limits

    return place(read_model(path), Settings(**settings), cards, **limits(model_config(path.parent)))


async def fill(pilot, form, name: str, text: str) -> None:
    """Focus the field and put `text` in it as a paste does: one change, the cursor after it. Set, not typed key
    by key (harlequin's tests do the same): what each key does is test_book_with_keys_only's."""
    field = form.query_one(f"#{name}", Input)
    field.focus()
    field.value = text
    field.cursor_position = len(text)
    await pilot.pause()


async def open_form(pilot, *keys: str) -> BookingModal:
    await ready(pilot)
    await pilot.press(*keys, "b")
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, BookingModal))
    return pilot.app.screen


def fit_line(form) -> str:
    return str(form.query_one("#fit", Static).render())


class TestBookingFormModel:
    async def test_the_model_field_completes_from_the_model_dirs(self, make_app, model_dir):
        app = make_app(config=model_config(model_dir))
        async with app.run_test(size=(120, 40)) as pilot:
            form = await open_form(pilot, "down", "down", "down", "down")
            await wait_for(pilot, lambda: form.models != [])
            assert form.models == [str(model_dir / "big" / f"{HEAVY}.gguf"), str(model_dir / "tiny.gguf")]
            assert form.query_one("#ctx", Input).disabled and form.query_one("#parallel", Input).disabled
            model = form.query_one("#model", Input)
            await fill(pilot, form, "model", f"{model_dir}/t")
            await wait_for(pilot, lambda: model._suggestion == str(model_dir / "tiny.gguf"))
            await pilot.press("right")  # takes the completion
            assert model.value == str(model_dir / "tiny.gguf")
            assert not form.query_one("#ctx", Input).disabled and not form.query_one("#parallel", Input).disabled
            await wait_for(pilot, lambda: "fits 1 card" in fit_line(form))

    async def test_the_live_line_shows_the_memory_per_card_and_the_fit(self, make_app, model_dir):
        tiny = model_dir / "tiny.gguf"
        app = make_app(config=model_config(model_dir))
        async with app.run_test(size=(120, 40)) as pilot:
            form = await open_form(pilot, "down", "down", "down", "down")  # card 4
            await fill(pilot, form, "model", str(tiny))
            await wait_for(pilot, lambda: "fits 1 card" in fit_line(form))
            card = estimate(tiny, 1).per_card[0]
            assert fit_line(form) == (
                f"≈ {card.total_mib:,.0f} MiB per card (weights {card.weights_mib:.1f} + KV {card.kv_mib:.1f} + "
                f"compute {card.compute_mib:.1f} + overhead 500) · fits 1 card")
            assert form.query_one("#fit").has_class("-fits")
            await wait_for(pilot, lambda: form.error is None)  # and the slot is free: enter would book it
            # A longer context on the same card: the KV cache and compute grow past the card's 630 MiB.
            big = estimate(tiny, 1, ctx=131072).per_card[0]
            assert big.total_mib > 630
            await fill(pilot, form, "ctx", "131072")
            await wait_for(pilot, lambda: "does not fit" in fit_line(form))
            assert fit_line(form) == (f"does not fit on 1 card: card 4 needs {big.total_mib:,.0f} MiB, over the 630 MiB "
                                      "limit; no group of up to 8 fits: lower the context or parallel")
            assert form.query_one("#fit").has_class("-over")
            assert form.error == "tiny.gguf does not fit on 1 card, nor on 8: lower the context or parallel"

    async def test_a_model_without_a_count_books_the_smallest_group_that_fits(self, make_app, model_dir, seeded_db):
        heavy = model_dir / "big" / f"{HEAVY}.gguf"
        assert not estimate(heavy, 1).fits and estimate(heavy, 2).fits  # the shape is chosen so
        app = make_app(config=model_config(model_dir))
        async with app.run_test(size=(120, 40)) as pilot:
            form = await open_form(pilot)
            await fill(pilot, form, "cards", "")
            await fill(pilot, form, "model", str(heavy))
            await wait_for(pilot, lambda: "books 2 cards, the fewest that fit" in fit_line(form))
            await wait_for(pilot, lambda: "no 2 cards are free" in str(form.query_one("#message", Static).render()))
            form.query_one("#or-later", Checkbox).value = True  # two cards are free later: take that, and queue
            await wait_for(pilot, lambda: "✓ cards" in str(form.query_one("#message", Static).render()))
            assert "· queued ·" in str(form.query_one("#message", Static).render())
            assert "✓" in str(form.query_one("#or-later", Checkbox).render())  # ticked shows a tick, unticked a blank
            await pilot.press("enter")
            await wait_for(pilot, lambda: not isinstance(app.screen, BookingModal))
        made = [b for b in bookings(seeded_db) if b.user == "alice" and b.request is not None]
        assert len(made) == 1 and len(made[0].cards) == 2 and made[0].queued == "cards"
        request = made[0].request
        assert (request["model"], request["ctx"], request["parallel"], request["cards_planned"]) == (str(heavy), 4096, 1, 2)
        assert request["per_card_mib"] == [round(c.total_mib) for c in estimate(heavy, 2).per_card]

    async def test_a_model_too_big_for_the_count_is_refused_in_the_form(self, make_app, model_dir, seeded_db):
        heavy = model_dir / "big" / f"{HEAVY}.gguf"
        before, log_before = bookings(seeded_db), event_count(seeded_db)
        app = make_app(config=model_config(model_dir))
        async with app.run_test(size=(120, 40)) as pilot:
            form = await open_form(pilot)
            await fill(pilot, form, "cards", "")
            await fill(pilot, form, "count", "1")
            await fill(pilot, form, "model", str(heavy))
            await wait_for(pilot, lambda: "does not fit" in fit_line(form))
            need = estimate(heavy, 1).per_card[0].total_mib
            assert fit_line(form) == (f"does not fit on 1 card: the card needs {need:,.0f} MiB, over the 630 MiB limit; "
                                      "fits on 2 cards")
            await pilot.press("enter")
            await pilot.pause(0.3)
            assert isinstance(app.screen, BookingModal)
            assert form.error == ("heavy.gguf does not fit on 1 card; it fits on 2: ask for 2, or leave cards and count "
                                  "empty for the fewest that fit")
        assert bookings(seeded_db) == before
        assert event_count(seeded_db) == log_before

    async def test_next_free_slot_looks_for_the_group_that_fits(self, make_app, model_dir):
        heavy = model_dir / "big" / f"{HEAVY}.gguf"
        app = make_app(config=model_config(model_dir))
        async with app.run_test(size=(120, 40)) as pilot:
            form = await open_form(pilot)
            await fill(pilot, form, "cards", "")
            await fill(pilot, form, "model", str(heavy))
            await pilot.press("ctrl+n")
            await wait_for(pilot, lambda: form.query_one("#cards", Input).value != "")
            assert len(parse_cards(form.query_one("#cards", Input).value)) == 2
            await wait_for(pilot, lambda: "fits 2 cards" in fit_line(form))  # now on the cards it named
            await wait_for(pilot, lambda: form.error is None)

    async def test_a_missing_or_marked_up_path_shows_as_typed(self, make_app, model_dir, seeded_db):
        before = bookings(seeded_db)
        app = make_app(config=model_config(model_dir))
        async with app.run_test(size=(120, 40)) as pilot:
            form = await open_form(pilot, "down", "down", "down", "down")
            await fill(pilot, form, "model", f"{model_dir}/[b]gone[/b].gguf")
            # the line follows the typing: wait for the whole path, not a prefix that was missing too
            await wait_for(pilot, lambda: form.error == f"no model file {model_dir}/[b]gone[/b].gguf")
            shown = form.query_one("#fit", Static).render()
            assert shown.plain == f"✗ no model file {model_dir}/[b]gone[/b].gguf"
            assert shown.spans == []  # no markup was read from the path
            assert form.error == f"no model file {model_dir}/[b]gone[/b].gguf"
            await pilot.press("enter")
            await pilot.pause(0.3)
            assert isinstance(app.screen, BookingModal)
            await fill(pilot, form, "model", "")  # no model: the old form, card 4 as given
            await wait_for(pilot, lambda: form.error is None and "no model" in fit_line(form))
            assert form.query_one("#ctx", Input).disabled
        assert bookings(seeded_db) == before

    def test_parse_form_with_a_model(self):
        request = parse_form("", "", "now", "1h", "", "batch", "", FROZEN_NOW, "/m/x.gguf", "32768", "4")
        assert (request.cards, request.count, request.model.path) == (None, None, "/m/x.gguf")
        assert (request.model.settings.ctx, request.model.settings.parallel) == (32768, 4)
        assert parse_form("1", "", "now", "1h", "", "batch", "", FROZEN_NOW, "", "0", "x").model is None  # unused
        for ctx, parallel, count, message in (("0", "1", "", "the context is"), ("4096", "0", "", "parallel is"),
                                              ("4096", "", "0", "the count is")):
            with pytest.raises(Exception, match=message):
                parse_form("", count, "now", "1h", "", "batch", "", FROZEN_NOW, "/m/x.gguf", ctx, parallel)

    def test_find_models_is_bounded(self, tmp_path):
        from app.tui.backend import find_models

        for path in ("a.gguf", "b.GGUF.txt", "one/two/three/four/deep.gguf", "one/two/three/four/five/deeper.gguf",
                     ".hidden/h.gguf", "split-00001-of-00002.gguf", "split-00002-of-00002.gguf"):
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / path).write_bytes(b"")
        (tmp_path / "loop").symlink_to(tmp_path)  # a link back up is not followed
        (tmp_path / "linked.gguf").symlink_to(tmp_path / "a.gguf")  # a link to a file is listed as itself
        found = find_models([str(tmp_path), str(tmp_path / "missing")])
        assert found == [str(tmp_path / p) for p in ("a.gguf", "linked.gguf", "one/two/three/four/deep.gguf",
                                                      "split-00001-of-00002.gguf")]
        assert len(find_models([str(tmp_path)], limit=2)) == 2
        assert find_models([str(tmp_path)], depth=0) == [str(tmp_path / p) for p in (
            "a.gguf", "linked.gguf", "split-00001-of-00002.gguf")]


class TestTimeline:
    async def test_select_with_keys_then_book_exactly_that(self, make_app, seeded_db):
        app = make_app(live=True)  # end to end: the new booking reaches the timeline through the real loader
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            timeline = app.board.timeline
            await pilot.press("tab")
            assert timeline.has_focus
            assert timeline.model.cursor == (0, 4)  # now: 15:30 in a view from 13:30
            await pilot.press("down", "down", "down", "down", "right", "right")  # card 4, 16:30
            await pilot.press("shift+down", "shift+right", "shift+right", "shift+right")  # cards 4-5, to 18:30
            assert timeline.model.selected_range() == ([4, 5], BASE + HOUR + 1800, BASE + 3 * HOUR + 1800)
            await pilot.press("b")
            await wait_for(pilot, lambda: isinstance(app.screen, BookingModal))
            form = app.screen
            assert form.query_one("#cards", Input).value == "4,5"
            assert form.query_one("#start", Input).value == "2026-11-29 16:30"
            assert form.query_one("#end", Input).value == "2026-11-29 18:30"
            await pilot.press("enter")
            await wait_for(pilot, lambda: not isinstance(app.screen, BookingModal))
            made = [b for b in bookings(seeded_db) if b.cards == (4, 5) and b.user == "alice"]
            assert [(b.start, b.end) for b in made] == [(BASE + HOUR + 1800, BASE + 3 * HOUR + 1800)]
            # ...and it appears on the timeline as one block over both cards.
            await wait_for(pilot, lambda: timeline.model.booking_at(4, 6) is not None)
            assert timeline.model.booking_at(4, 6) is timeline.model.booking_at(5, 6)

    async def test_mouse_drag_selects(self, make_app):
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            timeline = app.board.timeline
            x0 = timeline.model.label_width + 6 * timeline.cell_width  # 16:30 in a view from 13:30
            x1 = x0 + 2 * timeline.cell_width  # 17:30
            await pilot.mouse_down(timeline, offset=(x0, 2 + 4))  # card 4
            assert timeline.has_focus and timeline.model.cursor == (4, 6)
            # A drag: Pilot's hover moves without a button held, so send the motion a terminal sends.
            drag = type("Drag", (), {"button": 1, "x": x1, "y": 2 + 5})()
            timeline.on_mouse_move(drag)  # card 5
            await pilot.mouse_up(timeline, offset=(x1, 2 + 5))
            assert timeline.model.selected_range() == ([4, 5], BASE + HOUR + 1800, BASE + 3 * HOUR)

    async def test_zoom_day_steps_and_now(self, make_app):
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            timeline = app.board.timeline
            assert (timeline.model.view_start, timeline.model.view_end) == (FROZEN_NOW - 2 * HOUR, FROZEN_NOW + 22 * HOUR)
            await pilot.press("z")
            assert timeline.model.zoom.name == "week"
            await pilot.press("z")
            assert timeline.model.zoom.name == "hours"
            await pilot.press("z", "right_square_bracket")
            assert timeline.model.view_start == FROZEN_NOW - 2 * HOUR + 86400
            await wait_for(pilot, lambda: app.view.window_start == timeline.model.view_start)
            await pilot.press("left_square_bracket", "left_square_bracket", "t")
            assert timeline.model.view_start == FROZEN_NOW - 2 * HOUR

    async def test_many_cards_scroll_with_the_cursor(self, make_app, tmp_path):
        from app.gpu.simulated import parse_scenario

        big = simulated(parse_scenario({"cards": {"count": 64}}))
        db = tmp_path / "big.db"
        seed(db, big)
        app = make_app(source=big, db_path=db)
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            timeline = app.board.timeline
            await pilot.press("tab", "down")
            for _ in range(39):  # what "down" does (test_select_with_keys_then_book_exactly_that), without 39 keys
                timeline.action_move(1, 0)
            await pilot.pause()
            assert timeline.model.cursor[0] == 40
            assert timeline.model.row_offset <= 40 < timeline.model.row_offset + timeline.visible_rows


class TestLive:
    async def test_booking_made_by_the_cli_appears_within_two_seconds(self, tmp_path):
        from app.client.local import LocalClient
        from app.config import Config
        from app.tui.app import BoardApp

        config = Config(db_path=tmp_path / "live.db")
        db = config.db_path
        client = LocalClient.on(config, simulated(clock=time.time), ALICE)
        app = BoardApp(client, identity=ALICE, config=config, clock=time.time, host="gpu-box")
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(pilot)
            result = await asyncio.to_thread(
                run_board, "book", "--cards", "5", "--start", "+1h", "--for", "2h", "--note", "from the shell",
                env={"BOARD_DB": str(db), "BOARD_SIMULATE": "1"},
            )
            assert result.returncode == 0, result.stderr
            done = time.monotonic()
            await wait_for(pilot, lambda: any(b.note == "from the shell" for b in app.view.window), timeout=2.0)
            assert time.monotonic() - done < 2.0
            booking = next(b for b in app.view.window if b.note == "from the shell")
            timeline = app.board.timeline
            await pilot.pause()
            column = timeline.model.column_of(booking.start)
            assert timeline.model.booking_at(5, column) == booking

    async def test_stalled_telemetry_does_not_block_keys(self, make_app):
        stalled = simulated(replace(DEFAULT_FLEET, stall_seconds=30.0))
        app = make_app(source=stalled, live=True)  # the service's fleet reader really stalls
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.view is not None)
            await pilot.pause(0.2)
            assert app.fleet is None  # the first read is still asleep in the driver
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: isinstance(app.screen, HelpModal), timeout=10.0)
            await pilot.press("escape", "m")
            await wait_for(pilot, lambda: isinstance(app.screen, MyBookingsScreen), timeout=10.0)
            # No clock needed: the read is still stuck (30 s), so the keys were answered without waiting for it.
            assert app.fleet is None
            app.last_telemetry -= 10  # as if ten seconds had passed: the board says so
            app._tick()
            assert "no answer from the GPU driver for 1" in app.alert

    async def test_pollers_delivering_while_the_app_exits_do_not_crash(self, make_app):
        """At exit Textual removes the board's widgets before the pollers stop: a late read is dropped."""
        app = make_app(live=True)
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            await app.board.remove_children()
            app._tick()
            app._set_alert("telemetry failed: late", "telemetry")
            app.board.show_fleet()
            app.board.show_bookings()
            assert app.board.torn_down

    async def test_toast_when_my_booking_ends_within_ten_minutes(self, make_app):
        ends = BASE + 4 * HOUR  # alice's first booking ends at 19:00
        app = make_app(clock=lambda: ends - 7 * 60)
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            await wait_for(pilot, lambda: len(app._notifications) > 0)
            messages = [n.message for n in app._notifications]
            assert any("booking #1" in m and "ends at 19:00" in m and "in 7 min" in m for m in messages)
            await pilot.pause(1.2)  # the next ticks do not repeat it
            assert len([n for n in app._notifications if "booking #1" in n.message]) == 1

    async def test_no_toast_for_other_peoples_bookings(self, make_app):
        app = make_app(clock=lambda: BASE + 2 * HOUR - 5 * 60, identity=Identity("bob", 1002, False))
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            await pilot.pause(0.3)
            assert not [n for n in app._notifications if "ends at" in n.message]


class TestMyBookings:
    async def test_a_booking_someone_else_changed_is_marked_for_its_holder(self, make_app, seeded_db):
        conn = sqlite3.connect(seeded_db)
        with conn:  # what an admin's move leaves on the row (the service's part is tested in tests/service)
            rows.set_notice(conn, 6, "moved from Mon 09:00-11:00 to Mon 10:00-12:00 by admin erin")
            conn.execute("UPDATE bookings SET queued = 'cards' WHERE id = 6")
        conn.close()
        app = make_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            await pilot.press("m")
            await wait_for(pilot, lambda: isinstance(app.screen, MyBookingsScreen))
            screen = app.screen
            await wait_for(pilot, lambda: screen.selected() is not None)
            table = screen.query_one("#mine")
            cells = {c: str(table.get_cell("6", c)) for c in ("state", "note")}
            assert cells["state"] == "queued"
            assert cells["note"].startswith("⚑ moved from Mon 09:00-11:00 to Mon 10:00-12:00 by admin erin")
            assert str(table.get_cell("1", "note")).startswith("⚑") is False
            await pilot.press("escape")
            booking = next(b for b in app.view.upcoming if b.id == 6)
            assert app.board.timeline.model.block_label(booking, 0, 0).startswith("⚑ alice")
            assert "⚑ moved from Mon 09:00-11:00" in str(describe(booking, FROZEN_NOW))

    async def test_cancel_from_my_bookings(self, make_app, seeded_db):
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            await pilot.press("m")
            await wait_for(pilot, lambda: isinstance(app.screen, MyBookingsScreen))
            screen = app.screen
            await wait_for(pilot, lambda: screen.selected() is not None)
            assert [b.id for b in screen.mine()] == [1, 6]
            await pilot.press("down", "c")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal))
            await pilot.press("y")
            await wait_for(pilot, lambda: [b.id for b in screen.mine()] == [1])
        assert {b.id: b.status for b in bookings(seeded_db)}[6] == "cancelled"

    async def test_release_and_extend(self, make_app, seeded_db):
        app = make_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            await pilot.press("m")
            await wait_for(pilot, lambda: isinstance(app.screen, MyBookingsScreen))
            screen = app.screen
            await wait_for(pilot, lambda: screen.selected() is not None)
            await pilot.press("e")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ExtendModal")
            await fill(pilot, app.screen, "extend", "30m")
            await pilot.press("enter")
            await wait_for(pilot, lambda: {b.id: b.end for b in bookings(seeded_db)}[1] == BASE + 4 * HOUR + 1800)
            await pilot.press("r")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal))
            await pilot.press("n")  # declined: nothing happens
            await pilot.pause(0.2)
            assert {b.id: b.end for b in bookings(seeded_db)}[1] == BASE + 4 * HOUR + 1800
            await pilot.press("r")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal))
            await pilot.press("y")
            await wait_for(pilot, lambda: {b.id: b.end for b in bookings(seeded_db)}[1] == FROZEN_NOW)


class TestAdmin:
    async def test_admin_screen_absent_for_non_admins(self, make_app):
        app = make_app(identity=ALICE)
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            await pilot.press("a")
            await pilot.pause(0.2)
            assert not isinstance(app.screen, AdminScreen)
            assert "a" not in app._bindings.key_to_bindings
            assert all(b.action != "admin" for _, b, *_ in app.active_bindings.values())
            commands = [c.title for c in app.get_system_commands(app.screen)]
            assert "Admin" not in commands and "Book cards" in commands
            assert "Admin" not in app.export_screenshot()  # the footer says nothing of an admin screen

    async def test_admin_reassigns_and_sees_the_audit_log(self, make_app, seeded_db):
        app = make_app(identity=ERIN_ADMIN)
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            await pilot.press("a")
            await wait_for(pilot, lambda: isinstance(app.screen, AdminScreen))
            screen = app.screen
            await wait_for(pilot, lambda: len(screen.bookings) == 6)
            await pilot.press("down", "down", "down")  # erin's batch on card 7 this evening
            assert screen.selected().user == "erin"
            await pilot.press("r")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ReassignModal")
            await fill(pilot, app.screen, "cards", "4")
            await pilot.press("enter")
            await wait_for(pilot, lambda: {b.id: b.cards for b in bookings(seeded_db)}[4] == (4,))
            await wait_for(pilot, lambda: "reassign" in str(screen.query_one("#audit").get_row_at(0)))
            await wait_for(pilot, lambda: screen.selected() is not None and screen.selected().id == 4)
            await pilot.press("down")  # frank's
            await pilot.press("c")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal))
            await pilot.press("y")
            await wait_for(pilot, lambda: {b.id: b.status for b in bookings(seeded_db)}[5] == "cancelled")

    async def test_audit_columns_fit_rows_the_screen_drew_before_measuring(self, make_app, monkeypatch):
        """On a loaded machine the screen's update timer can draw a table between its rows' arrival and its idle
        pass (which sizes the auto-width columns): drawn here just before each idle pass that has new rows. The
        OUTCOME cells then show whole (`ok {"cards": [0, 1]}`), not cut to the label's width (`ok {"ca`) until the
        cursor moves. Wrong versions: the admin screen on Textual's plain DataTable; MeasuredTable without its new
        cache key after measuring."""
        from textual.widgets import DataTable

        idle_pass = DataTable._on_idle

        async def draw_then_measure(table, event):
            if table._new_rows:  # rows not yet measured: the screen draws (and caches) every line first
                table.app.export_screenshot()
            await idle_pass(table, event)

        monkeypatch.setattr(DataTable, "_on_idle", draw_then_measure)
        app = make_app(identity=ERIN_ADMIN)
        async with app.run_test(size=(80, 24)) as pilot:
            await ready(pilot)
            await pilot.press("a")
            await wait_for(pilot, lambda: isinstance(app.screen, AdminScreen))
            audit = app.screen.query_one("#audit", DataTable)
            await wait_for(pilot, lambda: audit.row_count == 6 and measured(app))
            outcomes = [audit.get_row_at(i)[-1].plain for i in range(audit.row_count)]
            assert 'ok {"cards": [0, 1]}' in outcomes
            await pilot.pause()  # the repaint the measuring asked for
            shown = [strip.text.rstrip() for strip in app.screen._compositor.render_strips()]  # the terminal's lines
            for outcome in outcomes:
                assert any(line.endswith(f"  {outcome}") for line in shown), (outcome, shown)


class TestCardDetail:
    async def test_enter_opens_the_card(self, make_app):
        app = make_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            await pilot.press("down", "down", "enter")
            await wait_for(pilot, lambda: isinstance(app.screen, CardDetailScreen))
            screen = app.screen
            assert screen.uuid.endswith("000000000002")
            processes = screen.query_one("#processes")
            assert processes.row_count == 1 and "41207" in str(processes.get_row_at(0)[0])
            assert len(app.history[screen.uuid]) == 121  # ten minutes at 5 s, and now
            await pilot.press("escape")
            await wait_for(pilot, lambda: not isinstance(app.screen, CardDetailScreen))


    async def test_the_charts_show_the_services_history_with_power_over_1_h_24_h_and_7_d(self, make_app, seeded_db):
        from textual.widgets import Sparkline

        from app.history.store import HistoryStore, Sample

        uuid = "GPU-5090sim-0000-0000-0000-000000000002"
        store = HistoryStore(seeded_db.with_name("board.history.db"))
        # The last hour every 10 s, with a power only the store knows; a week ago, a 300 W stretch, rolled up.
        hour = [Sample(ts=FROZEN_NOW - 3600 + 10 * i, uuid=uuid, state="IN USE", dt=10, vram=20480, util=50,
                       temp=60, power=100 + i) for i in range(360)]
        week = [Sample(ts=FROZEN_NOW - 6 * 86400 + 10 * i, uuid=uuid, state="IN USE", dt=10, vram=30720, util=90,
                       temp=80, power=300) for i in range(60)]
        store.add(week + hour)
        store.roll_up(FROZEN_NOW - 3600)
        store.close()
        app = make_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            app.push_screen(CardDetailScreen(uuid))
            await wait_for(pilot, lambda: isinstance(app.screen, CardDetailScreen) and app.screen.points)
            screen = app.screen
            power = screen.query_one("#power-chart", Sparkline)
            assert list(power.data) == [100 + i for i in range(360)]
            assert str(screen.query_one("#vram-label").render()) == "1 h VRAM max 20.0G"
            assert str(screen.query_one("#power-label").render()) == "power max 459/575W"
            await pilot.press("3")
            await wait_for(pilot, lambda: screen.points and screen.span.key == "7d" and list(power.data)[0] == 300)
            assert str(screen.query_one("#vram-label").render()) == "7 d VRAM max 30.0G"  # the week-old peak, rolled up
            assert len(screen.points) == 3  # two rollups' half hour, and the last hour from the raw samples
            await pilot.press("h", "h")  # 7 d, 1 h, 24 h
            await wait_for(pilot, lambda: screen.span.key == "24h" and screen.points and list(power.data)[0] == 129)
            assert len(screen.points) == 12  # the last hour in 5-minute steps: the week-old stretch is not in it


class TestCardTable:
    async def test_a_booking_request_shows_beside_the_vram_and_a_holder_over_it_is_flagged(self, make_app, tmp_path):
        from app.gpu.model import GpuProcess
        from app.gpu.simulated import demo_uid

        # Card 4: alice's server holds 22000 MiB of the 20000 asked for (10 % over); card 6: a container
        # (the holder's, as far as anyone can tell) within its 4096.
        server = GpuProcess(47003, 22000, "alice", demo_uid("alice"), "llama-server -m qwen.gguf")
        source = simulated(replace(DEFAULT_FLEET, processes=(*DEFAULT_FLEET.processes, (4, server))))
        db = tmp_path / "requests.db"
        seed(db, source)
        app = make_app(source=source, db_path=db)
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            table = app.board.card_table
            assert "req" not in " ".join(str(c) for c in table.get_row_at(4))  # no request, no room taken
            for card, mib in ((4, 20000), (6, 4096)):
                await app.backend.call("book", cards=[card], start=FROZEN_NOW, end=FROZEN_NOW + 2 * HOUR,
                                       request={"model": "qwen2.5-14b", "ctx": 4096, "parallel": 1, "per_card_mib": [mib]})
            app.reload_bookings()  # what the service's bookings event does to a board whose pollers run
            await wait_for(pilot, lambda: "req" in str(table.get_row_at(6)[2]))
            over, within = ([str(c) for c in table.get_row_at(i)] for i in (4, 6))
            assert over[2].endswith("/31.8 req 19.5") and over[1] == "IN USE OVER"
            assert within[2].endswith("/31.8 req 4.0") and "OVER" not in within[1]
            assert table.virtual_size.width <= table.size.width  # the wider VRAM column still fits 120
            await pilot.resize_terminal(80, 24)  # compact: no room for the request; the flag stays
            await wait_for(pilot, lambda: not app.board.card_table.get_row_at(4)[2].plain.endswith("req 19.5"))
            await pilot.pause()
            compact = [str(c) for c in app.board.card_table.get_row_at(4)]
            assert compact[1] == "IN USE OVER" and "req" not in compact[2]


    async def test_a_poll_redraws_only_the_line_that_moved_as_far_as_anyone_reads(self, make_app, monkeypatch):
        """A poll where one card's utilisation jumps and another's power moves 2 W: the table builds one cell and
        one line anew, and repaints only that line (DataTable drew the changed rows' every cell again, through
        Rich's rendering, about 4 ms a row); power moves the table only by 5 W or more."""
        from textual.geometry import Region

        from app.tui.widgets.card_table import CardTable, Cell

        app = make_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            await pilot.pause()
            table = app.board.card_table
            statuses = table.statuses
            lines = range(table.header_height + len(statuses))
            for y in lines:  # drawn once, as an idle board's table is between polls
                table.render_line(y)
            jumps = next(i for i, s in enumerate(statuses) if s.reading.utilization_pct is not None)
            creeps = next(i for i, s in enumerate(statuses) if i != jumps and s.reading.power_w is not None)
            util = (statuses[jumps].reading.utilization_pct + 40) % 100
            before = [str(c) for c in table.get_row_at(creeps)]
            cells: list[str] = []  # the cells built (each is kept until what it shows changes)
            built: list[int] = []  # the rows whose line was built again
            refreshed: list[tuple] = []
            make_cell, build_line, refresh = Cell.__init__, CardTable._build_line, CardTable.refresh

            def counted_cell(cell, parts, justify="left"):
                cells.append("".join(text for text, _ in parts))
                make_cell(cell, parts, justify)

            def counted_line(widget, row):
                built.append(row)
                return build_line(widget, row)

            def counted_refresh(widget, *regions, **kwargs):
                refreshed.append(regions)
                return refresh(widget, *regions, **kwargs)

            monkeypatch.setattr(Cell, "__init__", counted_cell)
            monkeypatch.setattr(CardTable, "_build_line", counted_line)
            monkeypatch.setattr(CardTable, "refresh", counted_refresh)

            def moved(i, s):
                r = s.reading
                if i == jumps:
                    return replace(s, reading=structs.replace(r, utilization_pct=util))
                if i == creeps:
                    return replace(s, reading=structs.replace(r, power_w=r.power_w + 2))
                return s

            table.show([moved(i, s) for i, s in enumerate(statuses)], app.clock())
            for y in lines:
                table.render_line(y)
            assert cells == [f"{util}%"] and built == [jumps]
            y = table.header_height + jumps - int(table.scroll_y)
            assert refreshed == [(Region(0, y, table.size.width, 1),)]
            assert [str(c) for c in table.get_row_at(creeps)] == before
            assert str(table.get_row_at(jumps)[table.column_keys.index("util")]) == f"{util}%"


    async def test_keys_and_clicks_move_the_cursor_and_choose_a_card(self, make_app):
        """As DataTable's: arrows, ctrl+end, ctrl+home and the pages move the row cursor (held within the cards);
        a click highlights a row and a click on the highlighted row, like enter, opens that card."""
        app = make_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            table = app.board.card_table
            uuid = [s.reading.uuid for s in table.statuses]
            assert table.has_focus and table.cursor_row == 0
            await pilot.press("up", "down", "down", "down")
            assert table.status_at_cursor().reading.uuid == uuid[3]
            await pilot.press("home", "end", "left")  # sideways: nothing
            assert table.cursor_row == 3
            await pilot.press("ctrl+end", "down")
            assert table.cursor_row == len(uuid) - 1
            await pilot.press("pageup")
            assert table.cursor_row == 0
            await pilot.press("pagedown", "ctrl+home")
            assert table.cursor_row == 0
            await pilot.click(table, offset=(3, table.header_height + 5))
            assert table.cursor_row == 5 and not isinstance(app.screen, CardDetailScreen)
            await pilot.click(table, offset=(3, table.header_height + 5))
            await wait_for(pilot, lambda: isinstance(app.screen, CardDetailScreen))
            assert app.screen.uuid == uuid[5]


class TestUntrustedText:
    async def test_hostile_text_renders_inert(self, make_app, tmp_path):
        from tests.tui.conftest import hostile_scenario

        source = simulated(hostile_scenario())
        db = tmp_path / "hostile.db"
        seed(db, source, extra=((HOSTILE_USER, (4,), -1, 3, "experiment", HOSTILE_NOTE),))
        app = make_app(source=source, db_path=db)
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            lines = [app.board.timeline.render_line(y).text for y in range(12)]
            lines += [str(app.board.query_one("#detail").render())]
            table = app.board.card_table
            lines += [str(cell) for cell in table.get_row_at(4)]
            await pilot.press("tab", "down", "down", "down", "down")  # the timeline cursor on the hostile block
            lines += [str(app.board.query_one("#detail").render())]
            joined = "\n".join(lines)
            assert "\x1b" not in joined and "\u202e" not in joined and "\x07" not in joined
            assert "m[bold red]al\\x1b[31mlory\\u202e" in joined  # the markup shows as typed
            assert "[link=http://evil.example/" in joined and "\\x1b]8;;http://evil.example/\\x07" in joined
            app.action_card_detail(table.statuses[4].reading.uuid)
            await wait_for(pilot, lambda: isinstance(app.screen, CardDetailScreen))
            await pilot.pause()
            process = [str(cell) for cell in app.screen.query_one("#processes").get_row_at(0)]
            assert process[1].startswith("m[bold red]al\\x1b")  # inert, then cut to the column
            assert process[4] == "python -c '[blink]x[/blink]' \\x1b[1;31mred\\x1b[0m \\x1b]0;owned\\x07 \\u2066rtl\\u2069"
            notes = [str(app.screen.query_one("#bookings").get_row_at(i)[-1]) for i in range(2)]
            assert any(n.startswith("\\x1b]8;;http://evil.example/\\x07click me\\x1b]8;;\\x07 [link=") for n in notes)


class TestHelp:
    def test_every_binding_is_in_the_help(self):
        from app.tui.app import BoardApp
        from app.tui.screens.main import BoardScreen
        from app.tui.widgets.timeline import Timeline

        listed = " / ".join(keys for _, keys, _ in KEYS)
        names = {"question_mark": "?", "left_square_bracket": "[", "right_square_bracket": "]"}
        for cls in (BoardApp, BoardScreen, Timeline, MyBookingsScreen, AdminScreen, BookingModal, CardDetailScreen):
            for binding in cls.BINDINGS:
                for key in binding.key.split(","):
                    key = names.get(key, key)
                    key = "shift+arrows" if key.startswith("shift+") else key
                    assert key in listed, f"{cls.__name__}: {key} is missing from app.tui.keys"


class TestServerLog:
    async def test_new_lines_are_measured_in_place_not_by_a_worker_that_outlives_the_board(self):
        """Log measures new lines in a thread worker that calls back into the app; a board that quit as a line
        arrived failed its exit with WorkerFailed (NoActiveAppError). The servers' log measures in place."""
        from textual.app import App

        from app.tui.screens.server_log import ServerLog

        class Host(App):
            def compose(self):
                yield ServerLog()

        app = Host()
        async with app.run_test(size=(80, 10)):
            log = app.query_one(ServerLog)
            log.write_lines(["x" * 300, "short"])
            assert list(app.workers) == []
            assert (log.virtual_size.width, log.line_count) == (300, 2)
