"""The Servers screen's start form: pick one of your active bookings and a model, set context and slots.

It only collects and checks the fields (`parse_start`); the screen sends `serve_start` with them, so
the rules (holder, active booking, model, ports, extra arguments) are the service's alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Checkbox, Input, Label, Select, Static

from app.core.request import readable
from app.core.text import format_cards, inert
from app.errors import BadInput, BoardError
from app.model import Booking
from app.tui.render import duration
from app.tui.screens.confirm import MODAL_CSS, FormModal

MAX_MODELS = 500
DEFAULT_CTX, DEFAULT_PARALLEL = 4096, 1


def find_models(directories: tuple[str, ...], limit: int = MAX_MODELS) -> list[str]:
    """GGUF files under the configured model directories (sorted, at most `limit`)."""
    found: list[str] = []
    for directory in directories:
        root = Path(directory).expanduser()
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*.gguf")):
            if path.is_file():
                found.append(str(path))
            if len(found) >= limit:
                return found
    return found


@dataclass(frozen=True, slots=True)
class StartRequest:
    booking_id: int
    model: str
    ctx: int
    parallel: int
    metrics: bool = True


def parse_start(booking_id: int | None, model: str, ctx: str, parallel: str, metrics: bool) -> StartRequest:
    """The dialog's fields -> a request, or BadInput with the one line to show."""
    if booking_id is None:
        raise BadInput("pick one of your active bookings")
    model = model.strip()
    if not model:
        raise BadInput("pick a model (or type the path of a .gguf file)")
    numbers = []
    for name, text in (("context", ctx), ("parallel", parallel)):
        text = text.strip()
        if not text.isdigit() or int(text) < 1:
            raise BadInput(f"{name} must be a whole number from 1")
        numbers.append(int(text))
    return StartRequest(booking_id, model, numbers[0], numbers[1], metrics)


class StartServerModal(FormModal[StartRequest | None]):
    """Pick a booking and a model, set context and slots, see the booked cards' free VRAM; Enter starts."""

    DEFAULT_CSS = MODAL_CSS.format(name="StartServerModal") + """
    StartServerModal > Vertical { width: 80; border: thick $primary; }
    StartServerModal .title { color: $primary; }
    StartServerModal Select { width: 1fr; }
    StartServerModal #vram { height: auto; color: $text-muted; }
    StartServerModal Checkbox { height: 1; border: none; padding: 0; }
    """

    def __init__(self, bookings: list[Booking]) -> None:
        super().__init__()
        self.bookings = {b.id: b for b in bookings}
        self.models: list[str] = []

    def compose(self) -> ComposeResult:
        first = next(iter(self.bookings.values()))
        request = readable(first.request)  # a row stored before requests were checked may hold anything
        with Vertical():
            yield Static(Text("Start llama-server"), classes="title")
            with Horizontal():
                yield Label("Booking", classes="field")
                yield Select([(self._booking_label(b), b.id) for b in self.bookings.values()], value=first.id,
                             allow_blank=False, id="booking", compact=True)
            with Horizontal():
                yield Label("Models", classes="field")
                yield Select([], prompt="looking in the model directories…", id="models", compact=True)
            with Horizontal():
                yield Label("Model", classes="field")
                yield Input(inert(request.get("model", "")), placeholder="/models/name.gguf", id="model", compact=True)
            with Horizontal():
                yield Label("Context", classes="field")
                yield Input(str(request.get("ctx") or DEFAULT_CTX), id="ctx", compact=True)
            with Horizontal():
                yield Label("Parallel", classes="field")
                yield Input(str(request.get("parallel") or DEFAULT_PARALLEL), id="parallel", compact=True)
            yield Checkbox("metrics (tokens/s)", value=True, id="metrics", compact=True)
            yield Static("", id="vram")
            yield Static("", classes="message")
            with Horizontal(classes="buttons"):
                yield Button("Start (enter)", id="yes", variant="primary", compact=True)
                yield Button("Cancel (esc)", id="no", compact=True)

    def _booking_label(self, booking: Booking) -> str:
        now = self.app.clock()
        return f"#{booking.id} · cards {format_cards(booking.cards)} · {duration(booking.end - now)} left"

    def on_mount(self) -> None:
        self.query_one("#model", Input).focus()
        self._show_vram()
        self._scan_models()

    @work(thread=True, exclusive=True, exit_on_error=False)
    def _scan_models(self) -> None:
        found = find_models(tuple(self.app.config.llama.model_dirs))
        self.app.call_from_thread(self._models_found, found)

    def _models_found(self, found: list[str]) -> None:
        self.models = found
        select = self.query_one("#models", Select)
        if found:
            select.set_options([(inert(Path(p).name, 60), p) for p in found])
            select.prompt = f"{len(found)} model(s) in the model directories"
        else:
            dirs = ", ".join(self.app.config.llama.model_dirs) or "none configured (llama.model_dirs)"
            select.prompt = f"no .gguf files in {inert(dirs, 60)}"
        model = self.query_one("#model", Input)
        if not model.value and found:
            model.value = found[0]
        self._show_vram()

    @on(Select.Changed, "#models")
    def _model_picked(self, event: Select.Changed) -> None:
        if isinstance(event.value, str):
            self.query_one("#model", Input).value = event.value

    @on(Select.Changed, "#booking")
    @on(Input.Changed, "#model")
    def _changed(self) -> None:
        self._show_vram()

    def _show_vram(self) -> None:
        chosen = self.query_one("#booking", Select).value  # Select.BLANK when none is chosen
        booking = self.bookings.get(chosen) if isinstance(chosen, int) else None
        fleet = self.app.fleet
        text = Text()
        if booking is not None:
            readings = {c.uuid: c for c in fleet.cards} if fleet else {}
            parts = []
            for index, uuid in zip(booking.cards, booking.card_uuids):
                card = readings.get(uuid)
                if card is None or card.memory_total_mib is None or card.memory_used_mib is None:
                    parts.append(f"card {index}: n/a")
                else:
                    free = (card.memory_total_mib - card.memory_used_mib) / 1024
                    parts.append(f"card {index}: {free:.1f} GiB free")
            text.append("free VRAM  " + " · ".join(parts))
        path = self.query_one("#model", Input).value.strip()
        if path:
            try:
                size = os.path.getsize(os.path.expanduser(path)) / 2**20
                shown = f"{size / 1024:.1f} GiB" if size >= 1024 else f"{size:.1f} MiB"
                text.append(f"\nmodel file {shown} (the weights; KV cache and a 10-15 % runtime reserve come on top)")
            except OSError:
                text.append("\nmodel file not found")
        self.query_one("#vram", Static).update(text)

    def _request(self) -> StartRequest:
        booking = self.query_one("#booking", Select).value
        return parse_start(
            booking if isinstance(booking, int) else None,
            self.query_one("#model", Input).value, self.query_one("#ctx", Input).value,
            self.query_one("#parallel", Input).value, self.query_one("#metrics", Checkbox).value,
        )

    @on(Input.Submitted)
    def _submitted(self) -> None:
        try:
            self.dismiss(self._request())
        except BoardError as error:
            message = self.query_one(".message", Static)
            message.set_classes("message -error")
            message.update(Text(inert(str(error), 200)))

