"""Servers: llama-server on booked cards. The list, a start dialog, stop behind a confirmation, a live log.

Threads, none of them the UI's:
- `ServerWatch` (one per app, started with the board): every 2 s, on its own SQLite connection,
  it reconciles (dead servers become crashed), stops servers whose booking ended (any running
  board does), shows demo servers as processes on their simulated cards, reads /metrics for
  tokens/s, and publishes a frozen `ServersView`. The screen reads `latest` on a timer and
  diffs its DataTable by server id.
- Starting and stopping run on short-lived daemon threads with their own connection: a start
  waits up to llama.ready_timeout_s for /health, a stop up to 10 s for SIGTERM, and neither
  may hold up the UI or `q` (Textual joins thread workers at exit; daemon threads it abandons).
- `LogFollower` tails the highlighted server's log file and hands new lines to the Log widget.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Button, Checkbox, DataTable, Footer, Input, Label, Log, Select, Static

from app.errors import BadInput, BoardError
from app.core.text import format_cards, inert
from app.llama import rows
from app.llama.rows import Server
from app.model import Booking
from app.tui.render import cursor_key, duration, untrusted
from app.tui.screens.confirm import MODAL_CSS, ConfirmModal, FormModal, settle_inputs
from app.tui.widgets.header import BoardHeader

WATCH_SECONDS = 2.0
RECENT_SECONDS = 24 * 3600
LOG_LINES = 200
MAX_MODELS = 500
DEFAULT_CTX, DEFAULT_PARALLEL = 4096, 1


# -- data ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerLine:
    server: Server
    tokens_per_s: float | None


@dataclass(frozen=True, slots=True)
class ServersView:
    lines: tuple[ServerLine, ...]
    loaded_at: float
    error: str | None = None


class ServerWatch:
    """The app's server loop (see the module docstring). `latest` is replaced whole, never mutated."""

    def __init__(self, app) -> None:
        self.app = app
        self.latest: ServersView | None = None
        self._stopped = threading.Event()
        self._woken = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="board-servers", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._woken.set()

    def stop(self) -> None:
        self._stopped.set()
        self._woken.set()

    def _loop(self) -> None:
        from app.llama.health import TokenRate, metrics
        from app.llama.processes import feed_simulated
        from app.llama.service import ServerService
        from app.store.db import connect, data_version

        app = self.app
        rates: dict[int, TokenRate] = {}
        seen_version = None
        try:
            conn = connect(app.db_path)
        except Exception as error:  # noqa: BLE001 - shown on the screen; the board keeps going
            self.latest = ServersView((), time.time(), f"{error}")
            return
        try:
            while not self._stopped.is_set():
                try:
                    # Nothing to watch while no server runs and nobody else has written: the idle board.
                    version = data_version(conn)
                    running = self.latest is None or any(line.server.live for line in self.latest.lines)
                    if version == seen_version and not running and not self._woken.is_set():
                        self._woken.wait(WATCH_SECONDS)
                        continue
                    seen_version = version
                    service = ServerService(conn, app.identity, app.config, clock=app.clock)
                    service.reconcile()
                    for server in service.enforce_booking_end():
                        self._notify(f"Server {server.id} ({inert(server.user, 16)}) stopped: booking"
                                     f" #{server.booking_id} ended", "warning")
                    if getattr(app.source, "simulated", False):
                        feed_simulated(app.source, conn)
                    now = time.time()
                    found = [s for s in rows.listing(conn, limit=200)
                             if s.live or (s.ended_at or s.created_at) >= now - RECENT_SECONDS]
                    lines = []
                    for server in found:
                        rate = None
                        if server.state == rows.READY and server.metrics:
                            tracker = rates.setdefault(server.id, TokenRate())
                            rate = tracker.update(metrics(server.host, server.port, timeout=0.5), time.monotonic())
                        lines.append(ServerLine(server, rate))
                    self.latest = ServersView(tuple(lines), now)
                except Exception as error:  # noqa: BLE001 - e.g. a locked database: retried next round
                    previous = self.latest.lines if self.latest else ()
                    self.latest = ServersView(previous, time.time(), f"{error}")
                self._woken.wait(WATCH_SECONDS)
                self._woken.clear()
        finally:
            conn.close()

    def _notify(self, message: str, severity: str = "information") -> None:
        _notify(self.app, message, severity)


def _notify(app, message: str, severity: str = "information") -> None:
    try:
        app.call_from_thread(app.notify, message, severity=severity, markup=False, timeout=10)
    except RuntimeError:  # the app has gone
        pass


def start_server_watch(app) -> ServerWatch:
    watch = ServerWatch(app)
    watch.start()
    return watch


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


class LogFollower:
    """Tails one log file on a daemon thread; `emit(lines)` is called with each batch of new lines."""

    def __init__(self, path: str, emit: Callable[[list[str]], None], poll_s: float = 0.25) -> None:
        self.path, self.emit, self.poll_s = path, emit, poll_s
        self._stopped = threading.Event()
        threading.Thread(target=self._run, name="board-log", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        from app.llama.logs import tail

        try:
            position = os.path.getsize(self.path)
        except OSError:
            position = 0
        if not self._send(tail(self.path, LOG_LINES)):
            return
        pending = b""
        while not self._stopped.wait(self.poll_s):
            try:
                with open(self.path, "rb") as f:
                    f.seek(position)
                    chunk = f.read(1 << 20)
            except OSError:
                continue
            if not chunk:
                continue
            position += len(chunk)
            pending += chunk
            *complete, pending = pending.split(b"\n")
            if complete and not self._send([line.decode("utf-8", "replace") for line in complete]):
                return

    def _send(self, lines: list[str]) -> bool:
        if self._stopped.is_set():
            return False
        try:
            self.emit([inert(line.replace("\t", "    ")) for line in lines])
        except RuntimeError:  # the app has gone
            return False
        return True


# -- the screen ---------------------------------------------------------------------------------


def _server_cells(line: ServerLine, now: float) -> tuple[Text, ...]:
    s = line.server
    if s.live:
        uptime = duration(now - (s.ready_at or s.created_at)) if s.state == rows.READY else "-"
    else:
        uptime = "-"
    rate = f"{line.tokens_per_s:.1f}" if line.tokens_per_s is not None else ("-" if s.metrics else "off")
    style = {"ready": "bold", "crashed": "bold red", "failed": "bold red", "starting": "italic",
             "stopping": "italic"}.get(s.state, "dim")
    return (
        Text(str(s.id)), Text(s.state, style=style), untrusted(s.alias or Path(s.model).name, 24),
        untrusted(s.user, 12), Text(format_cards(s.cards)), Text(str(s.port)), Text(uptime), Text(rate),
    )


COLUMNS = (("id", "#", 4), ("state", "STATE", 9), ("model", "MODEL", 24), ("user", "USER", 12),
           ("cards", "CARDS", 9), ("port", "PORT", 6), ("uptime", "UPTIME", 8), ("tps", "TOK/S", 7))


class ServersScreen(Screen):
    DEFAULT_CSS = """
    ServersScreen #title { height: 1; padding: 0 1; text-style: bold; background: $primary-muted; }
    ServersScreen #servers { height: 1fr; min-height: 5; }
    ServersScreen #detail { height: auto; max-height: 4; padding: 0 1; color: $text-muted; }
    ServersScreen #detail.-error { color: $error; }
    ServersScreen #log { height: 2fr; border-top: solid $primary; }
    """
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("n", "start_server", "Start", tooltip="Start llama-server on one of your active bookings"),
        Binding("x", "stop_server", "Stop", tooltip="Stop the highlighted server (asks first)"),
        Binding("l", "focus_log", "Log", tooltip="Scroll the highlighted server's log"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._follower: LogFollower | None = None
        self._following: int | None = None

    def compose(self) -> ComposeResult:
        yield BoardHeader()
        yield Static(Text("Servers · n start · x stop · l log · escape back"), id="title")
        yield DataTable(cursor_type="row", id="servers")
        yield Static("", id="detail")
        yield Log(max_lines=5000, id="log", auto_scroll=True)
        yield Footer()

    @property
    def watch(self) -> ServerWatch | None:
        return self.app.server_watch  # the app runs it whenever this screen can open

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for key, label, width in COLUMNS:
            table.add_column(label, key=key, width=width)
        self.refresh_rows()
        self.set_interval(0.5, self.refresh_rows)
        table.focus()

    def on_unmount(self) -> None:
        if self._follower is not None:
            self._follower.stop()

    def lines(self) -> tuple[ServerLine, ...]:
        view = self.watch.latest if self.watch else None
        return view.lines if view else ()

    def refresh_rows(self) -> None:
        table = self.query_one(DataTable)
        view = self.watch.latest if self.watch else None
        lines = view.lines if view else ()
        now = time.time()
        keys = [str(line.server.id) for line in lines]
        current = [k.value for k in table.rows]
        row = table.cursor_row
        with self.app.batch_update():
            if keys != current:
                table.clear()
                for line in lines:
                    table.add_row(*_server_cells(line, now), key=str(line.server.id))
                if lines:
                    table.move_cursor(row=min(max(row, 0), len(lines) - 1))
            else:
                for line in lines:
                    for (column, _, _), cell in zip(COLUMNS, _server_cells(line, now)):
                        table.update_cell(str(line.server.id), column, cell)
        self._show_detail(view)
        self._follow(self.selected())

    def selected(self) -> Server | None:
        by_id = {str(line.server.id): line.server for line in self.lines()}
        return by_id.get(cursor_key(self.query_one(DataTable)))

    def _show_detail(self, view: ServersView | None) -> None:
        detail = self.query_one("#detail", Static)
        server = self.selected()
        if view is not None and view.error:
            detail.set_classes("-error")
            detail.update(Text(f"servers: {inert(view.error, 200)}"))
            return
        detail.set_classes("")
        if view is None:
            detail.update(Text("loading…"))
        elif server is None:
            detail.update(Text("No servers now or in the last day. Press n to start one on your active booking."))
        else:
            parts = [f"booking #{server.booking_id}", server.url if server.live else "",
                     server.exit_text or "", server.reason or "", f"log {server.log_path}"]
            text = Text(" · ".join(inert(p, 120) for p in parts if p))
            if server.state in (rows.CRASHED, rows.FAILED):
                detail.set_classes("-error")
            detail.update(text)

    @on(DataTable.RowHighlighted, "#servers")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._follow(self.selected())

    def _follow(self, server: Server | None) -> None:
        wanted = server.id if server else None
        if wanted == self._following:
            return
        self._following = wanted
        if self._follower is not None:
            self._follower.stop()
            self._follower = None
        log = self.query_one(Log)
        log.clear()
        if server is None or not server.log_path:
            return
        self._follower = LogFollower(server.log_path, lambda lines: self.app.call_from_thread(log.write_lines, lines))

    def action_focus_log(self) -> None:
        self.query_one(Log).focus()

    # -- start ---------------------------------------------------------------------------------

    def my_active_bookings(self) -> list[Booking]:
        view, me, now = self.app.view, self.app.identity, self.app.clock()
        if view is None:
            return []
        return [b for b in view.upcoming if b.uid == me.uid and b.active(now)]

    @work(exit_on_error=False)
    async def action_start_server(self) -> None:
        bookings = self.my_active_bookings()
        if not bookings:
            self.notify("You have no active booking: book cards first (b), then start a server on them.",
                        severity="warning", markup=False)
            return
        request = await self.app.push_screen_wait(StartServerModal(bookings))
        if request is None:
            return
        app, watch = self.app, self.watch

        def start(service) -> None:
            server = service.start(request.booking_id, model=request.model, ctx=request.ctx,
                                   parallel=request.parallel, metrics=request.metrics)
            _notify(app, f"Starting server {server.id} on cards {format_cards(server.cards)}, port {server.port}")
            if watch:
                watch.wake()
            server = service.wait_ready(server)
            _notify(app, f"Server {server.id} ready: {server.url}")

        self._in_background("board-server-start", start)

    # -- stop ----------------------------------------------------------------------------------

    @work(exit_on_error=False)
    async def action_stop_server(self) -> None:
        server = self.selected()
        if server is None or not server.live:
            self.app.bell()
            return
        me = self.app.identity
        if server.uid != me.uid and not me.is_admin:
            self.notify(f"Server {server.id} belongs to {inert(server.user, 16)}; only they or an admin can stop it.",
                        severity="error", markup=False)
            return
        body = Text(f"#{server.id} ")
        body.append(inert(server.alias or Path(server.model).name, 40), "bold")
        body.append(f" · {inert(server.user, 16)} · cards {format_cards(server.cards)} · port {server.port}")
        if not await self.app.push_screen_wait(ConfirmModal("Stop this server?", body, yes="Stop")):
            return
        def stop(service) -> None:
            done = service.stop(server.id)
            _notify(self.app, f"Server {done.id} {done.state}" + (f" ({done.exit_text})" if done.exit_text else ""))

        self._in_background("board-server-stop", stop)

    def _in_background(self, name: str, job: Callable) -> None:
        """`job(ServerService)` on its own thread and connection (starting and stopping take seconds);
        its errors become notifications, and the watch looks again when it is done."""
        app, watch = self.app, self.watch
        topology = app.fleet.topology if app.fleet else None

        def run() -> None:
            from app.llama.service import ServerService
            from app.store.db import connect

            try:
                conn = connect(app.db_path)
            except BoardError as error:
                _notify(app, str(error), "error")
                return
            try:
                job(ServerService(conn, app.identity, app.config, topology=topology, clock=app.clock))
            except BoardError as error:
                _notify(app, str(error), "error")
            finally:
                conn.close()
                if watch:
                    watch.wake()

        threading.Thread(target=run, name=name, daemon=True).start()


# -- the start dialog ---------------------------------------------------------------------------


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
        request = first.request or {}
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
                yield Input(str(request.get("model") or ""), placeholder="/models/name.gguf", id="model", compact=True)
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
        settle_inputs(self)
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
        booking = self.bookings.get(self.query_one("#booking", Select).value)
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

