"""Small modals: a yes/no confirmation, the extend prompt and the admin's reassign prompt."""

from __future__ import annotations

from datetime import datetime
from typing import TypeVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from app.errors import BadInput, BoardError
from app.core.text import cards_text, format_cards, inert
from app.core.timeparse import TimeInputError, parse_duration, parse_end
from app.model import Booking
from app.tui.node import BoardNode
from app.tui.render import NOTICE_MARK, duration, short_time

MODAL_CSS = """
{name} {{ align: center middle; }}
{name} > Vertical {{
    width: 64; max-width: 100%; height: auto; max-height: 100%;
    border: thick $warning; background: $surface; padding: 0 1;
}}
{name} .title {{ text-style: bold; color: $warning; }}
{name} .body {{ margin: 1 0; }}
{name} Horizontal {{ height: 1; }}
{name} Label.field {{ width: 12; color: $text-muted; }}
{name} Input {{ width: 1fr; }}
{name} .message {{ height: auto; min-height: 1; }}
{name} .message.-error {{ color: $error; text-style: bold; }}
{name} .message.-ok {{ color: $success; }}
{name} .buttons {{ height: 1; margin-top: 1; }}
{name} Button {{ height: 1; min-width: 10; border: none; margin-right: 1; }}
"""


def describe(booking: Booking, now: float, here: str = "") -> Text:
    """'#12 alice · cards 0,1 · 14:00 → 20:00 · finetune · note' with the user's text inert ('#12 alice · project A
    · cards ...' on a board with projects); a booking on another host than `here` names its cards 'gpu2:0,1'."""
    text = Text(f"#{booking.id} ")
    text.append(inert(booking.user, 16) + " ", "bold")  # the space in its run: see card_table's holder
    if booking.project:  # a board with projects: whose budget it is
        text.append(f"· project {inert(booking.project, 24)} ")
    text.append(f"· {cards_text(booking.cards, booking.host, here)}"
                f" · {short_time(booking.start, now)} → {short_time(booking.end, now)} · {booking.klass}")
    if booking.note:
        text.append(" · ")
        text.append(inert(booking.note, 80), "italic")
    if booking.notice:
        text.append(f" · {NOTICE_MARK} {inert(booking.notice, 80)}", "bold yellow")
    return text


class ConfirmModal(BoardNode, ModalScreen[bool]):
    """Yes or no. Enter or y confirms; Escape or n declines."""

    DEFAULT_CSS = MODAL_CSS.format(name="ConfirmModal")
    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, title: str, body: Text | str, yes: str = "Yes") -> None:
        super().__init__()
        self.title_text, self.body, self.yes = title, body, yes

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(self.title_text), classes="title")
            yield Static(self.body if isinstance(self.body, Text) else Text(self.body), classes="body")
            with Horizontal(classes="buttons"):
                yield Button(f"{self.yes} (y)", id="yes", variant="error", compact=True)
                yield Button("No (n)", id="no", compact=True)

    def on_mount(self) -> None:
        self.query_one("#yes", Button).focus()

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


ResultType = TypeVar("ResultType")


class FormModal(BoardNode, ModalScreen[ResultType]):
    """A small form: Enter or the `yes` button submits (`_submitted`), Escape or any other button closes it."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def _submitted(self) -> None:
        raise NotImplementedError

    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "yes":
            self._submitted()
        else:
            self.dismiss(None)


class ExtendModal(FormModal[int | None]):
    """Asks how much longer, shows the new end, and confirms: returns the new end (epoch) or None."""

    DEFAULT_CSS = MODAL_CSS.format(name="ExtendModal")

    def __init__(self, booking: Booking, now: float) -> None:
        super().__init__()
        self.booking, self.now = booking, now
        self.new_end: int | None = None

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(f"Extend booking #{self.booking.id}"), classes="title")
            yield Static(describe(self.booking, self.now, self.app.fleet_host), classes="body")
            with Horizontal():
                yield Label("Add or end", classes="field")
                yield Input("1h", placeholder="+1h, 30m, or an end such as 20:00", id="extend", compact=True)
            yield Static("", classes="message")
            with Horizontal(classes="buttons"):
                yield Button("Extend (enter)", id="yes", variant="warning", compact=True)
                yield Button("Cancel (esc)", id="no", compact=True)

    def on_mount(self) -> None:
        self.query_one(Input).focus()
        self._update(self.query_one(Input).value)

    def _parse(self, text: str) -> int:
        text = text.strip()
        if not text:
            raise BadInput("say how much longer (1h) or until when (20:00)")
        try:
            return self.booking.end + int(parse_duration(text.lstrip("+")).total_seconds())
        except TimeInputError:
            pass
        try:  # as `board extend --until`: 20:00 is the first 20:00 after the current end
            end = parse_end(text, datetime.fromtimestamp(self.booking.end).astimezone(),
                            datetime.fromtimestamp(self.now).astimezone(),
                            night_start=lambda: self.app.config.booking.night_start_minute, after="the current end")
        except TimeInputError as error:
            raise BadInput(str(error)) from None
        return int(end.timestamp())

    @on(Input.Changed)
    def _changed(self, event: Input.Changed) -> None:
        self._update(event.value)

    def _update(self, value: str) -> None:
        message = self.query_one(".message", Static)
        try:
            self.new_end = self._parse(value)
        except BoardError as error:
            self.new_end = None
            message.set_classes("message -error")
            message.update(Text(str(error)))
            return
        message.set_classes("message -ok")
        message.update(Text(f"new end {short_time(self.new_end, self.now)}"
                            f" ({duration(self.new_end - self.booking.start)} in all)"))

    @on(Input.Submitted)
    def _submitted(self) -> None:
        if self.new_end is not None:
            self.dismiss(self.new_end)
        else:
            self.app.bell()



class ReassignModal(FormModal[tuple[tuple[int, ...] | None, str | None] | None]):
    """Admin: new cards and/or a new holder for a booking. Returns (cards, user) or None."""

    DEFAULT_CSS = MODAL_CSS.format(name="ReassignModal")

    def __init__(self, booking: Booking, now: float) -> None:
        super().__init__()
        self.booking, self.now = booking, now

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(f"Reassign booking #{self.booking.id}"), classes="title")
            yield Static(describe(self.booking, self.now, self.app.fleet_host), classes="body")
            with Horizontal():
                yield Label("Cards", classes="field")
                yield Input(format_cards(self.booking.cards), id="cards", compact=True)
            with Horizontal():
                yield Label("User", classes="field")
                yield Input(inert(self.booking.user), id="user", compact=True)
            yield Static("", classes="message")
            with Horizontal(classes="buttons"):
                yield Button("Reassign (enter)", id="yes", variant="warning", compact=True)
                yield Button("Cancel (esc)", id="no", compact=True)

    def on_mount(self) -> None:
        self.query_one("#cards", Input).focus()

    def _result(self) -> tuple[tuple[int, ...] | None, str | None]:
        from app.core.parse import parse_cards

        cards = tuple(parse_cards(self.query_one("#cards", Input).value))
        user = self.query_one("#user", Input).value.strip()
        new_cards = cards if tuple(sorted(cards)) != tuple(sorted(self.booking.cards)) else None
        new_user = user if user and user != self.booking.user else None
        if new_cards is None and new_user is None:
            raise BadInput("change the cards or the user, or press escape")
        return new_cards, new_user

    def show_error(self, message: str) -> None:
        widget = self.query_one(".message", Static)
        widget.set_classes("message -error")
        widget.update(Text(inert(message, 300)))

    @on(Input.Submitted)
    def _submitted(self) -> None:
        try:
            self.dismiss(self._result())
        except BoardError as error:
            self.show_error(str(error))

