"""Servers: llama-server on booked cards. The screen only shows; the rules are the service's.

- The servers arrive as the board's other state does: a loader thread (app.tui.pollers.servers_loop)
  posts a frozen `ServersView` when the service says servers or bookings changed, and every 2 s while one
  meters tokens/s; the app publishes it on `servers_signal`. No enforcement here: booking ends are the
  service's (`board agent`), or in file mode the supervisor's own backstop.
- Start and stop send `serve_start` / `serve_stop` (app.llama.launch, shared with the CLI) from a
  short-lived daemon thread, so a start that waits for /health never holds up the UI or `q`.
- The log (app.tui.screens.server_log) follows the highlighted server's log.
- The detail line shows the memory llama.cpp allocated at load beside board's estimate (`memory_text`);
  card detail shows the same for the servers on its card.
- The start form is app.tui.screens.server_start.
- An on-demand server (the team catalog's, started by the gateway: docs/gateway.md#models-on-demand) reads
  "on demand" in the USER column instead of the runner account that holds its booking, and its detail line
  names the catalog alias and the project it is billed to. Which servers those are comes from the bookings the
  board has loaded (`Booking.on_demand`), so the mark needs no field of its own on the wire.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from app.core.text import format_cards, inert
from app.errors import BoardError
from app.llama import rows
from app.llama.rows import Server
from app.model import Booking
from app.tui.messages import BookingView, ServerLine, ServersView
from app.tui.node import BoardNode
from app.tui.pollers import own_client
from app.tui.render import duration, under_cursor, untrusted
from app.tui.screens.confirm import ConfirmModal
from app.tui.screens.server_log import ServerLog
from app.tui.screens.server_start import StartServerModal, find_models, parse_start  # noqa: F401 - re-exported
from app.tui.widgets.header import BoardHeader
from app.tui.widgets.table import MeasuredTable

def _notify(app, message: str, severity: str = "information") -> None:
    try:
        app.call_from_thread(app.notify, message, severity=severity, markup=False, timeout=10)
    except RuntimeError:  # the app has gone
        pass


def memory_text(server: Server, card: int | None = None) -> str | None:
    """'memory: measured X MiB (weights a, KV b, compute c) · estimated Y MiB', or None when neither is known.

    Measured is what llama.cpp allocated at load over all its buffers (host ones included), estimated board's
    figure over all cards. With `card` (one of the server's cards) and llama.cpp's figures for that card's
    device (CUDA<n>, n its place in the server's cards), that card's share of both."""
    measured, per_card = server.measured_memory, server.estimate_per_card
    if measured is None and per_card is None:
        return None
    where, memory, estimate = "memory", measured, sum(per_card) if per_card else None
    place = server.cards.index(card) if card in server.cards else None
    device = measured.devices.get(f"CUDA{place}") if measured is not None and place is not None else None
    if device is not None and place is not None:  # (a device is found only at a place)
        where, memory = "memory on this card", device
        estimate = per_card[place] if per_card and place < len(per_card) else None
    used = "measured -" if memory is None else (
        f"measured {_mib(memory.total_mib)} MiB (weights {_mib(memory.weights_mib)}, KV {_mib(memory.kv_mib)},"
        f" compute {_mib(memory.compute_mib)})")
    planned = "estimated -" if estimate is None else f"estimated {estimate:,} MiB"
    if server.estimate and server.estimate.get("forced"):
        planned += f", over the {server.estimate.get('limit_mib')} MiB limit (forced)"
    return f"{where}: {used} · {planned}"


def _mib(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def planned_text(planned) -> Text:
    """'planned: team (alice) from Mon 09:00, booking 42 · ...': the planned servers' next starts."""
    text = Text("planned: ")
    for n, plan in enumerate(planned):
        if n:
            text.append(" · ")
        text.append_text(untrusted(plan["alias"], 24))
        text.append(" (")
        text.append_text(untrusted(plan["user"], 12))
        when = time.strftime("%a %H:%M", time.localtime(plan["next_start"]))
        text.append(f") from {when}, booking {plan['next_booking']}")
    return text


# -- the screen ---------------------------------------------------------------------------------


def on_demand_bookings(view: BookingView | None) -> dict[int, Booking]:
    """The on-demand bookings among those the board has loaded, by id: the servers on them are the catalog's."""
    if view is None:
        return {}
    return {b.id: b for b in (*view.upcoming, *view.window) if b.on_demand}


def on_demand_text(booking: Booking) -> str:
    """'on demand: qwen-7b for project search (board models)': the detail line makes it inert."""
    project = f" for project {booking.project}" if booking.project else ""
    return f"on demand: {booking.on_demand}{project} (board models)"


def _server_cells(line: ServerLine, now: float, on_demand: Booking | None = None) -> tuple[Text, ...]:
    s = line.server
    uptime = duration(now - (s.ready_at or s.created_at)) if s.state == rows.READY else "-"
    rate = f"{line.tokens_per_s:.1f}" if line.tokens_per_s is not None else ("-" if s.metrics else "off")
    style = {"ready": "bold", "crashed": "bold red", "failed": "bold red", "starting": "italic",
             "stopping": "italic"}.get(s.state, "dim")
    return (
        Text(str(s.id)), Text(s.state, style=style), untrusted(s.alias or Path(s.model).name, 24),
        Text("on demand", style="italic") if on_demand else untrusted(s.user, 12), Text(format_cards(s.cards)),
        Text(str(s.port)), Text(uptime), Text(rate),
    )


COLUMNS = (("id", "#", 4), ("state", "STATE", 9), ("model", "MODEL", 24), ("user", "USER", 12),
           ("cards", "CARDS", 9), ("port", "PORT", 6), ("uptime", "UPTIME", 8), ("tps", "TOK/S", 7))


class ServersScreen(BoardNode, Screen):
    DEFAULT_CSS = """
    ServersScreen #title { height: 1; padding: 0 1; text-style: bold; background: $primary-muted; }
    ServersScreen #servers { height: 1fr; min-height: 5; }
    ServersScreen #detail { height: auto; max-height: 4; padding: 0 1; color: $text-muted; }
    ServersScreen #planned { height: auto; max-height: 4; padding: 0 1; color: $text-muted; display: none; }
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
        self.view: ServersView | None = None

    def compose(self) -> ComposeResult:
        yield BoardHeader()
        yield Static(Text("Servers · n start · x stop · l log · escape back"), id="title")
        yield MeasuredTable(cursor_type="row", id="servers")
        yield Static("", id="planned")
        yield Static("", id="detail")
        yield ServerLog(id="log")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for key, label, width in COLUMNS:
            table.add_column(label, key=key, width=width)
        if self.app.servers_view is not None:
            self.show(self.app.servers_view)
        else:
            self._show_detail()
        self.app.servers_signal.subscribe(self, self.show)
        table.focus()

    def lines(self) -> tuple[ServerLine, ...]:
        return self.view.lines if self.view else ()

    def show(self, view: ServersView) -> None:
        self.view = view
        table = self.query_one(DataTable)
        now = self.app.clock()  # the board's clock, as the rest of the board reads it
        demand = on_demand_bookings(self.app.view)
        keys = [str(line.server.id) for line in view.lines]
        current = [k.value for k in table.rows]
        row = table.cursor_row
        with self.app.batch_update():
            if keys != current:
                table.clear()
                for line in view.lines:
                    table.add_row(*_server_cells(line, now, demand.get(line.server.booking_id)),
                                  key=str(line.server.id))
                if view.lines:
                    table.move_cursor(row=min(max(row, 0), len(view.lines) - 1))
            else:
                for line in view.lines:
                    cells = _server_cells(line, now, demand.get(line.server.booking_id))
                    for (column, _, _), cell in zip(COLUMNS, cells):
                        table.update_cell(str(line.server.id), column, cell)
        planned = self.query_one("#planned", Static)
        planned.display = bool(view.planned)
        planned.update(planned_text(view.planned))
        self._show_detail()
        self.query_one(ServerLog).follow(self.selected(), self.app.client, self.app.identity)

    def selected(self) -> Server | None:
        by_id = {str(line.server.id): line.server for line in self.lines()}
        return under_cursor(self.query_one(DataTable), by_id)

    def _show_detail(self) -> None:
        detail = self.query_one("#detail", Static)
        view, server = self.view, self.selected()
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
            booking = on_demand_bookings(self.app.view).get(server.booking_id)
            parts = [on_demand_text(booking) if booking else "", f"booking #{server.booking_id}",
                     server.url if server.live else "", server.exit_text or "", server.reason or "",
                     f"log {server.log_path}" if server.log_path else ""]
            if server.state in (rows.CRASHED, rows.FAILED):
                detail.set_classes("-error")
            text = Text(" · ".join(inert(p, 120) for p in parts if p))
            memory = memory_text(server)
            if memory:
                text.append("\n" + inert(memory, 200))
            detail.update(text)

    @on(DataTable.RowHighlighted, "#servers")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail()
        self.query_one(ServerLog).follow(self.selected(), self.app.client, self.app.identity)

    def action_focus_log(self) -> None:
        self.query_one(ServerLog).focus()

    # -- start and stop: the service decides -----------------------------------------------------

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
        app = self.app

        def start(client) -> None:
            from app.fit.request import limits
            from app.llama import launch

            server, grant = launch.start(client, request.booking_id, socket_path=getattr(client, "path", None),
                                         model=request.model, ctx=request.ctx, parallel=request.parallel,
                                         metrics=request.metrics, fit_limits=limits(app.config))
            _notify(app, f"Starting server {server.id} on cards {format_cards(server.cards)}, port {server.port}")
            server = launch.wait_ready(client, server, timeout=float(grant["ready_timeout_s"]) + 15, poll_s=0.25)
            _notify(app, f"Server {server.id} ready: {server.url}")

        self._in_background("board-server-start", start)

    @work(exit_on_error=False)
    async def action_stop_server(self) -> None:
        server = self.selected()
        if server is None or not server.live:
            self.app.bell()
            return
        body = Text(f"#{server.id} ")
        body.append(inert(server.alias or Path(server.model).name, 40), "bold")
        body.append(f" · {inert(server.user, 16)} · cards {format_cards(server.cards)} · port {server.port}")
        if not await self.app.push_screen_wait(ConfirmModal("Stop this server?", body, yes="Stop")):
            return

        def stop(client) -> None:
            from app.llama import launch

            done = launch.stop(client, server.id)
            _notify(self.app, f"Server {done.id} {done.state}" + (f" ({done.exit_text})" if done.exit_text else ""))

        self._in_background("board-server-stop", stop)

    def _in_background(self, name: str, job: Callable) -> None:
        """`job(client)` on its own thread and client (starting and stopping take seconds); a refusal
        becomes a notification, one line from the service."""
        app = self.app

        def run() -> None:
            client = None
            try:
                client = own_client(app.client)
                job(client)
            except BoardError as error:
                _notify(app, str(error), "error")
            finally:
                if client is not None and client is not app.client:
                    client.close()
                app.reload_servers()

        threading.Thread(target=run, name=name, daemon=True).start()
