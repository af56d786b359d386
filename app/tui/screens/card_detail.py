"""Card detail: its processes, its VRAM, utilisation, temperature and power over the last hour, day or week (from
the service's history, app.history), the llama-servers board runs on it (with the memory llama.cpp allocated beside
board's estimate; shown only when there are some), and its bookings."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Sparkline, Static

from app.core.text import format_cards, format_elapsed, host_cards
from app.errors import BoardError
from app.core.cardstate import CardStatus
from app.tui.node import BoardNode
from app.tui.render import NA, TIME_WIDTH, gib, short_time, untrusted
from app.tui.messages import ServersView
from app.tui.screens.servers import memory_text
from app.tui.widgets.header import BoardHeader
from app.tui.widgets.table import MeasuredTable


@dataclass(frozen=True, slots=True)
class Span:
    key: str
    label: str
    seconds: int
    step: int  # about 300 points: raw samples for an hour, rollups beyond


SPANS = {"1h": Span("1h", "1 h", 3600, 10), "24h": Span("24h", "24 h", 86400, 300),
         "7d": Span("7d", "7 d", 7 * 86400, 1800)}
HISTORY_RELOAD_S = 30.0


def link_text(r) -> Text:
    """The card's PCIe link now against what it can do, its traffic, and where it sits: a narrow link or a place
    behind the chipset stands out, as the state does in the title (board doctor warns of both)."""
    line = Text("PCIe ")
    if r.pcie_gen is None or r.pcie_width is None:
        line.append(NA)
    else:
        narrow = r.pcie_max_width is not None and r.pcie_width < r.pcie_max_width
        line.append(f"Gen{r.pcie_gen} x{r.pcie_width}", "bold reverse" if narrow else "")
        if r.pcie_max_gen is not None and r.pcie_max_width is not None:
            line.append(f" of Gen{r.pcie_max_gen} x{r.pcie_max_width}")
    if r.behind_chipset:
        line.append(" BEHIND CHIPSET", "bold reverse")
    if r.pcie_tx_mib_s is not None and r.pcie_rx_mib_s is not None:
        line.append(f" · TX {r.pcie_tx_mib_s / 1024:.1f} RX {r.pcie_rx_mib_s / 1024:.1f} GiB/s")
    for name, value in (("slot", r.slot), ("NUMA", r.numa_node)):  # the serial is board cards' (80 columns)
        if value is not None:
            line.append(f" · {name} ").append_text(untrusted(str(value), 24))
    return line


def topology_text(snapshot, index: int) -> Text | None:
    """The other cards by how close they are, as nvidia-smi topo -m names the levels: "PXB 1-3 · SYS 4-7"."""
    from app.core.hardware import card_list
    from app.gpu.model import LINK_NAMES

    levels: dict[int, list[int]] = {}
    for card in snapshot.cards:
        if card.index != index:
            levels.setdefault(snapshot.topology.level(index, card.index), []).append(card.index)
    if not levels:
        return None
    parts = [f"{LINK_NAMES.get(level, 'SYS')} {card_list(cards)}" for level, cards in sorted(levels.items())]
    return Text("topology: " + " · ".join(parts), "dim")


class CardDetailScreen(BoardNode, Screen):
    DEFAULT_CSS = """
    CardDetailScreen #title { height: 1; padding: 0 1; text-style: bold; background: $primary-muted; }
    CardDetailScreen #facts { height: auto; padding: 0 1; }
    CardDetailScreen #charts { height: 3; padding: 0 1; }
    CardDetailScreen #charts > Vertical { width: 1fr; height: 3; margin-right: 1; }
    CardDetailScreen .chart-label { height: 1; color: $text-muted; }
    CardDetailScreen Sparkline { height: 2; }
    CardDetailScreen #vram-chart > .sparkline--max-color { color: $warning; }
    CardDetailScreen #vram-chart > .sparkline--min-color { color: $primary; }
    CardDetailScreen #util-chart > .sparkline--max-color { color: $success; }
    CardDetailScreen #util-chart > .sparkline--min-color { color: $primary-darken-2; }
    CardDetailScreen #temp-chart > .sparkline--max-color { color: $error; }
    CardDetailScreen #temp-chart > .sparkline--min-color { color: $warning-darken-2; }
    CardDetailScreen #power-chart > .sparkline--max-color { color: $accent; }
    CardDetailScreen #power-chart > .sparkline--min-color { color: $primary-darken-2; }
    CardDetailScreen .section { height: 1; padding: 0 1; text-style: bold; color: $accent; }
    CardDetailScreen #processes { height: auto; max-height: 40%; }
    CardDetailScreen #servers { height: auto; max-height: 30%; padding: 0 1; }
    CardDetailScreen #bookings { height: 1fr; }
    """
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("h", "next_span", "Span", tooltip="The charts over the last hour, day or week, in turn"),
        Binding("1", "span('1h')", "1 h", show=False),
        Binding("2", "span('24h')", "24 h", show=False),
        Binding("3", "span('7d')", "7 d", show=False),
    ]

    def __init__(self, uuid: str) -> None:
        super().__init__()
        self.uuid = uuid
        self.span = SPANS["1h"]
        # The service's points for this card and span ([t, VRAM GiB, util %, temp °C, power W]); None: not loaded.
        self.points: list[list[float]] | None = None

    def compose(self) -> ComposeResult:
        yield BoardHeader()
        yield Static("", id="title")
        yield Static("", id="facts")
        with Horizontal(id="charts"):
            for key, label in (("vram", "VRAM"), ("util", "utilisation"), ("temp", "temperature"), ("power", "power")):
                with Vertical():
                    yield Static(label, classes="chart-label", id=f"{key}-label")
                    yield Sparkline([], id=f"{key}-chart", summary_function=max)
        yield Static(Text("Processes"), classes="section")
        yield MeasuredTable(cursor_type="row", id="processes")
        yield Static(Text("Servers"), classes="section", id="servers-title")
        yield Static("", id="servers")
        yield Static(Text("Bookings"), classes="section")
        yield MeasuredTable(cursor_type="row", id="bookings")
        yield Footer()

    def on_mount(self) -> None:
        app = self.app
        processes = self.query_one("#processes", DataTable)
        for key, label, width in (("pid", "PID", 8), ("user", "USER", 18), ("vram", "VRAM GiB", 8),
                                  ("elapsed", "ELAPSED", 8), ("command", "COMMAND", None)):
            processes.add_column(label, key=key, width=width)
        bookings = self.query_one("#bookings", DataTable)
        projects = [("project", "PROJECT", 10)] if app.config.projects else []  # a board with [[projects]]
        for key, label, width in (("id", "#", 5), ("user", "USER", 12), *projects, ("cards", "CARDS", 8),
                                  ("start", "START", TIME_WIDTH), ("end", "END", TIME_WIDTH), ("class", "CLASS", 10),
                                  ("note", "NOTE", None)):
            bookings.add_column(label, key=key, width=width)
        self.update_all()
        self.update_servers(app.servers_view)
        app.fleet_signal.subscribe(self, lambda _: self.update_all())
        app.bookings_signal.subscribe(self, lambda _: self.update_bookings())
        app.servers_signal.subscribe(self, self.update_servers)
        self.load_history()
        self.set_interval(HISTORY_RELOAD_S, self.load_history)
        processes.focus()

    def action_next_span(self) -> None:
        keys = list(SPANS)
        self.action_span(keys[(keys.index(self.span.key) + 1) % len(keys)])

    def action_span(self, key: str) -> None:
        self.span = SPANS[key]
        self.points = None
        self.load_history()

    @work(exclusive=True, group="card-history", exit_on_error=False)
    async def load_history(self) -> None:
        """Ask the service for this card's history over the span; the charts draw what it holds."""
        span = self.span
        try:
            found = await self.app.backend.call("history", seconds=span.seconds, step=span.step, uuid=self.uuid)
        except BoardError:
            found = {}  # an older service, or none: the charts fall back to what this board saw
        if span is self.span:
            self.points = found.get(self.uuid, [])
            self.update_charts()

    def status(self) -> CardStatus | None:
        return next((s for s in self.app.statuses if s.reading.uuid == self.uuid), None)

    def update_all(self) -> None:
        status = self.status()
        if status is None:
            return
        app, r = self.app, status.reading
        title = Text(f"Card {host_cards([r.index], status.host, app.fleet_host)}")
        if status.label:
            title.append(" ").append_text(untrusted(status.label, 20))
        title.append(f" · {r.name or NA} · ")
        title.append(status.state, "bold reverse")
        for warning in status.warnings:
            title.append(f" {warning}", "bold")
        self.query_one("#title", Static).update(title)

        facts = Text()
        # A figure the card did not give is "n/a" alone (a LOST card's), not "n/a/31.8"
        used = NA if r.memory_used_mib is None else f"{gib(r.memory_used_mib)}/{gib(r.memory_total_mib)} GiB"
        facts.append(f"VRAM {used} · ")
        facts.append(f"util {NA if r.utilization_pct is None else f'{r.utilization_pct}%'} · ")
        facts.append(f"temp {NA if r.temperature_c is None else f'{r.temperature_c}°C'} · ")
        if r.power_w is None:
            facts.append(f"power {NA}\n")
        else:
            facts.append(f"power {r.power_w:.0f}" + ("" if r.power_limit_w is None else f"/{r.power_limit_w:.0f}") + " W\n")
        facts.append_text(link_text(r))
        facts.append("\n")
        if app.fleet is not None and app.remote(status.host) is None and (near := topology_text(app.fleet, r.index)):
            facts.append_text(near)
            facts.append("\n")
        facts.append(f"{r.uuid} · PCI {r.pci_bus_id or NA}", "dim")
        self.query_one("#facts", Static).update(facts)

        self.update_charts()

        table = self.query_one("#processes", DataTable)
        now = app.clock()
        table.clear()
        for p in r.processes:
            started = p.started_at
            table.add_row(
                Text(str(p.pid)),
                untrusted(p.user or "container/unknown", 18),
                Text(gib(p.used_mib)),
                Text(format_elapsed(None if started is None else now - started)),
                untrusted(p.command, 200),
            )
        if not r.processes:
            table.add_row(Text("-"), Text("no processes", "dim"), Text(""), Text(""), Text(""))
        self.update_bookings()

    def update_charts(self) -> None:
        """The four charts over the span: the service's points, or, until they come (or where it has none for
        the last hour), what this board saw."""
        status = self.status()
        points = self.points
        seen = ""
        if not points and self.span.key == "1h":
            points, seen = [list(h) for h in self.app.history.get(self.uuid, ())], " seen"
        points = points or []
        limit = status.reading.power_limit_w if status is not None else None
        for key, column in (("vram", 1), ("util", 2), ("temp", 3), ("power", 4)):
            self.query_one(f"#{key}-chart", Sparkline).data = [p[column] for p in points if len(p) > column] or [0]

        def peak(column: int) -> float | None:
            return max((p[column] for p in points if len(p) > column), default=None)

        mean_util = sum(p[2] for p in points) / len(points) if points else None
        # Short enough for a quarter of 80 columns: the span once, then each chart's figure.
        self.query_one("#vram-label", Static).update(
            Text(f"{self.span.label}{seen} VRAM max {NA if peak(1) is None else f'{peak(1):.1f}G'}"))
        self.query_one("#util-label", Static).update(
            Text(f"util mean {NA if mean_util is None else f'{mean_util:.0f}%'}"))
        self.query_one("#temp-label", Static).update(
            Text(f"temp max {NA if peak(3) is None else f'{peak(3):.0f}°C'}"))
        of = "" if limit is None else f"/{limit:.0f}"
        self.query_one("#power-label", Static).update(
            Text(f"power max {NA if peak(4) is None else f'{peak(4):.0f}{of}W'}"))

    def update_servers(self, view: ServersView | None) -> None:
        """The live servers on this card, each with its memory line; the section hides when there are none."""
        status = self.status()
        index = status.reading.index if status is not None else None
        found = [line.server for line in (view.lines if view is not None else ())
                 if line.server.live and index in line.server.cards]
        text = Text()
        for server in found:
            if text:
                text.append("\n")
            text.append(f"#{server.id} ").append_text(untrusted(server.alias or server.model, 40))
            text.append(" · ").append_text(untrusted(server.user, 12))
            text.append(f" · {server.state} · cards {format_cards(server.cards)} · port {server.port}")
            memory = memory_text(server, card=index)
            if memory:
                text.append(f"\n  {memory}", "dim")
        self.query_one("#servers", Static).update(text)
        for widget in (self.query_one("#servers-title"), self.query_one("#servers")):
            widget.display = bool(found)

    def update_bookings(self) -> None:
        view = self.app.view
        table = self.query_one("#bookings", DataTable)
        table.clear()
        if view is None:
            return
        now = self.app.clock()
        seen = set()
        for b in sorted((*view.upcoming, *view.window), key=lambda b: (b.start, b.id)):
            if self.uuid not in b.card_uuids or b.id in seen or b.end <= now - 86400:
                continue
            seen.add(b.id)
            project = [untrusted(b.project, 10)] if self.app.config.projects else []
            table.add_row(
                Text(str(b.id)), untrusted(b.user, 12), *project, Text(format_cards(b.cards)),
                Text(short_time(b.start, now)), Text(short_time(b.end, now)), Text(b.klass), untrusted(b.note, 80),
            )
        if not seen:
            table.add_row(Text(""), Text("no bookings", "dim"), *[Text("")] * (len(table.columns) - 2))
