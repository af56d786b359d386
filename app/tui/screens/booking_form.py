"""The booking form: a modal that validates live through the core and books on Enter.

Every keystroke re-parses the fields (the core's time parser) and, after a short pause, asks
the core to plan the booking on the database thread (policies, conflicts). The one-line
error the core raises is shown inline, verbatim; a valid form shows what Enter will book.

With a model (a .gguf, completed from [llama] model_dirs), a context and a parallel count, the
form sizes the booking by memory (app.fit, on the backend's own thread): a live line shows the
fullest card's MiB and the fit; no count books the smallest group that fits, and a count or cards
that are too small are refused in the form. The booking stores the request and its estimate.

On a board with projects ([[projects]]) a member of several picks one beside the class, and a line under them says
what is left of the chosen project's GPU-hour budget this period, and what this booking needs of it. A board
without projects shows neither.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from datetime import datetime

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.timer import Timer
from textual.widgets import Button, Checkbox, Input, Label, Select, Static

from app.config import CLASSES
from app.core.policy import policy_zone
from app.core.projects import of
from app.core.slots import GROUP_SIZES
from app.errors import BadInput, BoardError
from app.core.parse import parse_card_spec, parse_span
from app.core.text import host_cards, inert
from app.fit.estimate import Settings
from app.tui.backend import Backend, Booked, BookingRequest, Budget, ModelAsk, Sizing
from app.tui.node import BoardNode
from app.tui.render import duration, full_time, short_time

VALIDATE_DELAY = 0.15
NO_MODEL = "no model: the cards as given (a .gguf sizes them by its memory)"


@dataclass(frozen=True, slots=True)
class BookingDraft:
    """What the form opens with: from a timeline selection, a card row, or nothing."""

    cards: tuple[int, ...] = ()
    host: str | None = None  # another host's cards (named 'gpu2:0,1' in the form); None: this host's
    count: int | None = None
    start: int | None = None  # None: now
    end: int | None = None  # None: the default duration
    klass: str = "experiment"
    note: str = ""
    duration: str = "2h"


def _whole(text: str, what: str) -> int:
    text = text.strip().replace(",", "").replace("_", "")
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise BadInput(what)
    return int(text)


def parse_model(model: str, ctx: str, parallel: str) -> ModelAsk | None:
    """The model fields -> what to size, or None when no model is given (ctx and parallel are then ignored)."""
    if not model.strip():
        return None
    settings = Settings()
    if ctx.strip():
        settings = replace(settings, ctx=_whole(ctx, "the context is a number of tokens, such as 4096 or 32768"))
    if parallel.strip():
        settings = replace(settings, parallel=_whole(
            parallel, "parallel is how many requests the server serves at once: 1 or more"))
    return ModelAsk(model.strip(), settings)


def parse_form(
    cards: str, count: str, start: str, length: str, until: str, klass: str, note: str, now: float,
    model: str = "", ctx: str = "", parallel: str = "", night_start: int | None = None, or_later: bool = False,
    project: str | None = None,
) -> BookingRequest:
    """The form's fields -> a request, or BadInput with the one line to show; the times read as the CLI's do."""
    host, listed = parse_card_spec(cards) if cards.strip() else (None, None)  # 'gpu2:0-3': another host's
    chosen = tuple(listed) if listed is not None else None
    number = None
    if count.strip():
        if not (count.strip().isascii() and count.strip().isdigit()) or int(count.strip()) < 1:
            raise BadInput(f"the count is how many cards: {', '.join(map(str, GROUP_SIZES))}")
        number = int(count.strip())
    ask = parse_model(model, ctx, parallel)
    if chosen is None and number is None and ask is None:
        raise BadInput("say which cards (e.g. 0,1) or how many (1, 2, 4 or 8), or give a model to size it")
    if chosen is not None and number is not None:
        raise BadInput("give cards or a count, not both")
    if length.strip() and until.strip():
        raise BadInput("give a duration or an end, not both")
    begin, end = parse_span(start.strip() or "now", length if length.strip() else None,
                            until if until.strip() else None, datetime.fromtimestamp(now).astimezone(),
                            how_long="say how long: a duration such as 3h, or an end such as 18:00", night_start=night_start)
    return BookingRequest(chosen, number, begin, end, klass, note, model=ask, or_later=or_later, host=host,
                          project=project)


class Tick(Checkbox):
    """A checkbox that draws ✓ only when ticked: the compact look draws the same X either way."""

    BUTTON_INNER = " "

    def watch_value(self) -> None:
        self.BUTTON_INNER = "✓" if self.value else " "
        super().watch_value()


class BookingModal(BoardNode, ModalScreen[Booked | None]):
    """Returns the new booking with the service's notes on its cards, or None when dismissed with Escape."""

    DEFAULT_CSS = """
    BookingModal { align: center middle; }
    BookingModal > Vertical {
        width: 72; max-width: 100%; height: auto; max-height: 100%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    BookingModal #title { text-style: bold; color: $primary; width: 1fr; }
    BookingModal Horizontal { height: 1; margin-bottom: 1; }
    BookingModal.-short Horizontal { margin-bottom: 0; }
    BookingModal.-short #message { margin-bottom: 0; }
    BookingModal Label.field { width: 8; color: $text-muted; }
    BookingModal Label.or { width: auto; color: $text-muted; padding: 0 1; }
    BookingModal Input { width: 1fr; }
    BookingModal #cards { width: 20; }
    BookingModal #count, BookingModal #duration, BookingModal #ctx { width: 10; }
    BookingModal #parallel { width: 6; }
    BookingModal Input:disabled { color: $text-disabled; }
    BookingModal #fit { height: auto; margin-bottom: 1; color: $text-muted; }
    BookingModal.-short #fit { margin-bottom: 0; }
    BookingModal #fit.-fits { color: $success; }
    BookingModal #fit.-over { color: $warning; text-style: bold; }
    BookingModal #fit.-error { color: $error; }
    BookingModal #end { width: 1fr; }
    BookingModal #or-later { width: auto; margin-left: 1; }
    BookingModal Select { width: 24; }
    BookingModal #project { width: 1fr; }
    BookingModal #budget { height: auto; margin-bottom: 1; color: $text-muted; }
    BookingModal.-short #budget { margin-bottom: 0; }
    BookingModal #message { height: auto; min-height: 2; margin-bottom: 1; }
    BookingModal #message.-error { color: $error; text-style: bold; }
    BookingModal #message.-ok { color: $success; }
    BookingModal #message.-calm { color: $text-muted; }
    BookingModal #buttons { height: 1; margin: 0; }
    BookingModal Button { height: 1; min-width: 10; border: none; margin-right: 1; }
    BookingModal #hint { color: $text-muted; height: 1; }
    """
    BINDINGS = [
        Binding("escape", "dismiss_form", "Cancel", tooltip="Close without booking"),
        Binding("ctrl+n", "next_free", "Next free slot", tooltip="Fill in the earliest slot that fits"),
        Binding("ctrl+s", "submit", "Book", show=False),
    ]

    def __init__(self, backend: Backend, draft: BookingDraft = BookingDraft()) -> None:
        super().__init__()
        self.backend = backend
        self.draft = draft
        self._timer: Timer | None = None
        self._generation = 0
        self.error: str | None = None  # the message shown, for tests
        self.sizing: Sizing | None = None  # the model's last estimate on the form's cards, for tests
        self._sized_path: str | None = None
        self.models: list[str] = []  # the .gguf files found under [llama] model_dirs
        # The form opens calm: a refusal of what it opened with is said quietly until the member edits a field or
        # presses Book (issue 31 §8); `_opening` is the fields as they opened.
        self._opening: tuple | None = None
        self._pressed = False
        self.budgets: dict[str, Budget] | None = None  # each project's budget this period, once loaded
        self._needs: float | None = None  # the GPU-hours the last plan takes, for the budget line

    def compose(self) -> ComposeResult:
        d, now = self.draft, self.backend.clock()
        start = "now" if d.start is None or d.start <= now else full_time(d.start)
        with Vertical():
            yield Static(Text("Book cards"), id="title")
            with Horizontal():
                yield Label("Cards", classes="field")
                yield Input(host_cards(d.cards, d.host or ""), placeholder="0,1 or 4-7", id="cards", compact=True)
                yield Label("or count", classes="or")
                yield Input("" if d.count is None else str(d.count), placeholder="1/2/4/8", id="count", compact=True)
            with Horizontal():
                yield Label("Model", classes="field")
                yield Input("", placeholder=self._model_placeholder(), id="model", compact=True)
            with Horizontal():
                yield Label("Context", classes="field")
                yield Input(str(Settings.ctx), placeholder="tokens", id="ctx", restrict=r"[0-9]*", compact=True,
                            disabled=True)
                yield Label("parallel", classes="or")
                yield Input(str(Settings.parallel), placeholder="slots", id="parallel", restrict=r"[0-9]*",
                            compact=True, disabled=True)
            yield Static(NO_MODEL, id="fit")
            with Horizontal():
                yield Label("Start", classes="field")
                yield Input(start, placeholder="now, 14:00, tomorrow 9:00, mon 9-17", id="start", compact=True)
                yield Tick("or later", id="or-later", compact=True,
                               tooltip="the earliest start that fits from here on; it moves up when time frees")
            with Horizontal():
                yield Label("For", classes="field")
                yield Input("" if d.end is not None else d.duration, placeholder="3h", id="duration", compact=True)
                yield Label("or until", classes="or")
                yield Input("" if d.end is None else full_time(d.end), placeholder="18:00, tomorrow 9:00", id="end",
                            compact=True)
            with Horizontal():
                yield Label("Class", classes="field")
                yield Select([(c, c) for c in CLASSES], value=d.klass, allow_blank=False, id="klass", compact=True)
                if len(self.projects) > 1:  # a member of one needs no choice (board book --project's rule)
                    yield Label("project", classes="or")
                    yield Select([(Text(inert(p, 40)), p) for p in self.projects], value=self._first_project(d.klass),
                                 allow_blank=False, id="project", compact=True)
            if self.projects:
                yield Static("", id="budget")
            with Horizontal():
                yield Label("Note", classes="field")
                yield Input(d.note, placeholder="what it is for", id="note", compact=True)
            yield Static("", id="message")
            with Horizontal(id="buttons"):
                yield Button("Book", id="book", variant="primary", compact=True)
                yield Button("Next free slot", id="next-free", compact=True)
                yield Button("Cancel", id="cancel", compact=True)
            yield Static(Text("enter book · ctrl+n next free slot · esc cancel · tab next field"), id="hint")

    def on_mount(self) -> None:
        self.set_class(self.app.size.height < 30, "-short")
        self.query_one("#cards", Input).focus()  # the cards first, filled in or not: what the booking is of
        self._opening = self._fields()
        self._validate_now()
        dirs = self.app.config.llama.model_dirs
        if dirs:
            self._list_models(tuple(dirs))
        if self.projects:
            self._load_budgets()

    @property
    def projects(self) -> list[str]:
        """The projects the member books for, in the config's order ([] on a board without projects)."""
        return [p.name for p in of(self.app.config, self.app.identity.name)]

    def _first_project(self, klass: str) -> str:
        """What the choice opens on: the member's first project that may use the form's class, else their first."""
        config = self.app.config
        return next((p.name for p in of(config, self.app.identity.name) if klass in p.classes), self.projects[0])

    def project(self) -> str | None:
        """The chosen project: the member's pick, or their only one; None on a board without projects (or for a
        member of none: the service says why)."""
        for chosen in self.query("#project").results(Select):
            return str(chosen.value)
        return self.projects[0] if self.projects else None

    @work(exclusive=True, group="budgets", exit_on_error=False)
    async def _load_budgets(self) -> None:
        self.budgets = await self.backend.budgets()
        self.show_budget()

    def show_budget(self) -> None:
        """The chosen project's budget line: what is left this period, and what the form's booking needs of it."""
        project = self.project()
        budget = self.budgets.get(project) if self.budgets is not None and project is not None else None
        if budget is None:
            return
        line = budget.line(policy_zone(self.app.config))
        if self._needs is not None and budget.gpu_hours is not None:
            line += f" · this booking needs {self._needs:.1f} h"
        self.query_one("#budget", Static).update(Text(line))

    def _model_placeholder(self) -> str:
        dirs = self.app.config.llama.model_dirs
        first = os.path.abspath(os.path.expanduser(dirs[0])) if dirs else ""
        return f"optional: {first.rstrip('/')}/… (→ completes)" if first else "optional: /path/to/model.gguf"

    @work(exclusive=True, group="models", exit_on_error=False)
    async def _list_models(self, dirs: tuple[str, ...]) -> None:
        found = await self.backend.model_files(dirs)  # folders it can't read are passed over
        self.models = found
        self.query_one("#model", Input).suggester = SuggestFromList(found, case_sensitive=True)

    # -- reading the fields --------------------------------------------------------------------

    def _value(self, name: str) -> str:
        return self.query_one(f"#{name}", Input).value

    def _fields(self) -> tuple:
        return (tuple(i.value for i in self.query(Input)), tuple(s.value for s in self.query(Select)),
                self.query_one("#or-later", Checkbox).value)

    def request(self) -> BookingRequest:
        klass = self.query_one("#klass", Select).value
        return parse_form(
            self._value("cards"), self._value("count"), self._value("start"), self._value("duration"),
            self._value("end"), str(klass), self._value("note"), self.backend.clock(),
            self._value("model"), self._value("ctx"), self._value("parallel"),
            night_start=self.app.config.booking.night_start_minute,
            or_later=self.query_one("#or-later", Checkbox).value, project=self.project(),
        )

    def show_fit(self, text: str, state: str) -> None:
        """The live line under the model fields; state: '' (no model or waiting), -fits, -over or -error."""
        widget = self.query_one("#fit", Static)
        widget.set_classes(state)
        widget.update(Text(inert(text, 300)))

    def show_error(self, message: str) -> None:
        self.error = message
        if self.projects:  # nothing planned: the budget line without this booking's share
            self._needs = None
            self.show_budget()
        widget = self.query_one("#message", Static)
        if not self._pressed and self._fields() == self._opening:  # nothing asked yet: say it, calmly
            widget.set_classes("-calm")
            widget.update(Text(inert(message, 300)))
            return
        widget.set_classes("-error")
        widget.update(Text("✗ " + inert(message, 300)))

    def show_ok(self, text: str) -> None:
        self.error = None
        widget = self.query_one("#message", Static)
        widget.set_classes("-ok")
        widget.update(Text("✓ " + text))

    # -- live validation -----------------------------------------------------------------------

    @on(Input.Changed)
    @on(Select.Changed)
    @on(Checkbox.Changed)
    def _changed(self, event: Input.Changed | Select.Changed | Checkbox.Changed) -> None:
        if isinstance(event, Input.Changed) and event.input.id == "model":
            given = bool(event.value.strip())
            for name in ("ctx", "parallel"):  # they only mean something for a model
                self.query_one(f"#{name}", Input).disabled = not given
            if not given:
                self.sizing = self._sized_path = None
                self.show_fit(NO_MODEL, "")
        self._generation += 1
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_timer(VALIDATE_DELAY, self._validate_now)

    def _validate_now(self) -> None:
        self._generation += 1
        try:
            request = self.request()
        except BoardError as error:
            self.show_error(str(error))
            return
        self._check(request, self._generation)

    @work(exclusive=True, group="validate", exit_on_error=False)
    async def _check(self, request: BookingRequest, generation: int) -> None:
        if request.model is not None:
            sized = await self._size_model(request, generation)
            if sized is None:
                return
            request = sized
        try:
            plan = await self.backend.plan(request)
        except BoardError as error:
            if generation == self._generation:
                self.show_error(str(error))
            return
        if generation == self._generation:
            now = self.backend.clock()
            if self.projects:
                self._needs = len(plan.cards) * (plan.end - plan.start) / 3600
                self.show_budget()
            self.show_ok(
                f"{'card' if len(plan.cards) == 1 else 'cards'} {host_cards(plan.cards, request.host or '')} · "
                f"{short_time(plan.start, now)} → {short_time(plan.end, now)} ({duration(plan.end - plan.start)})"
                f" · {request.klass}{' · queued' if request.or_later else ''} · enter books it"
            )

    async def _size_model(self, request: BookingRequest, generation: int) -> BookingRequest | None:
        """The model's estimate on the form's cards, into the live line; the request sized for the service, or
        None (with the reason shown) when it can't be sized or does not fit."""
        assert request.model is not None
        if request.model.path != self._sized_path:
            self.show_fit(f"reading {os.path.basename(request.model.path)}…", "")
        try:
            sizing = await self.backend.size(request)
        except BoardError as error:
            if generation == self._generation:
                self.sizing, self._sized_path = None, request.model.path
                self.show_fit("✗ " + str(error), "-error")
                self.show_error(str(error))
            return None
        if generation != self._generation:
            return None
        self.sizing, self._sized_path = sizing, request.model.path
        self.show_fit(sizing.line(), "-fits" if sizing.fits else "-over")
        if not sizing.fits:
            self.show_error(sizing.refusal())
            return None
        return request.sized(sizing)

    # -- actions -------------------------------------------------------------------------------

    @on(Input.Submitted)
    def _submitted(self) -> None:
        self.action_submit()

    @on(Button.Pressed, "#book")
    def _book_pressed(self) -> None:
        self.action_submit()

    @on(Button.Pressed, "#next-free")
    def _next_pressed(self) -> None:
        self.action_next_free()

    @on(Button.Pressed, "#cancel")
    def _cancel_pressed(self) -> None:
        self.action_dismiss_form()

    def action_dismiss_form(self) -> None:
        self.dismiss(None)

    def action_submit(self) -> None:
        self._pressed = True
        self._generation += 1
        if self._timer is not None:
            self._timer.stop()
        try:
            request = self.request()
        except BoardError as error:
            self.show_error(str(error))
            self.app.bell()
            return
        self._book(request)

    @work(exclusive=True, group="submit", exit_on_error=False)
    async def _book(self, request: BookingRequest) -> None:
        try:
            booked = await self.backend.create(request)
        except BoardError as error:
            self.show_error(str(error))
            self.app.bell()
            return
        self.dismiss(booked)

    def action_next_free(self) -> None:
        self._pressed = True
        try:
            request = self.request()
        except BadInput as error:
            self.show_error(str(error))
            return
        self._find_next(request)

    @work(exclusive=True, group="next-free", exit_on_error=False)
    async def _find_next(self, request: BookingRequest) -> None:
        try:
            cards, start = await self.backend.next_free(request)
        except BoardError as error:
            self.show_error(str(error))
            return
        length = request.end - request.start
        with self.prevent(Input.Changed):
            self.query_one("#cards", Input).value = host_cards(cards, request.host or "")
            self.query_one("#count", Input).value = ""
            self.query_one("#start", Input).value = "now" if start <= self.backend.clock() else full_time(start)
            if self._value("end").strip():
                self.query_one("#end", Input).value = full_time(start + length)
        self._validate_now()
