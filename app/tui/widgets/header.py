"""The board's one-line header on every screen: host, cards, clock, who you are, the ADMIN and SIMULATED badges,
the board's own trouble (telemetry stalled, the service down, its database unreachable) and the service's firing
alerts."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from app.tui.node import BoardNode
from app.tui.render import local, untrusted


class BoardHeader(BoardNode, Widget):
    DEFAULT_CSS = """
    BoardHeader {
        dock: top;
        height: 1;
        background: $panel;
        color: $foreground;
    }
    BoardHeader > .header--host { text-style: bold; }
    BoardHeader > .header--fleet { color: $text-muted; }
    BoardHeader > .header--badge-admin { background: $error; color: $text; text-style: bold; }
    BoardHeader > .header--badge-simulated { background: $warning; color: $text; text-style: bold; }
    BoardHeader > .header--clock { color: $text-muted; }
    BoardHeader > .header--user { color: $accent; text-style: bold; }
    BoardHeader > .header--alerts { color: $warning; text-style: bold; }
    BoardHeader > .header--stale { background: $error; color: $text; text-style: bold; }
    """
    COMPONENT_CLASSES = {
        "header--host", "header--fleet", "header--badge-admin", "header--badge-simulated", "header--clock",
        "header--user", "header--alerts", "header--stale",
    }

    host: reactive[str] = reactive("")
    fleet: reactive[str] = reactive("")
    now: reactive[float] = reactive(0.0)
    user: reactive[str] = reactive("")
    admin: reactive[bool] = reactive(False)
    simulated: reactive[bool] = reactive(False)
    alert: reactive[str] = reactive("")  # e.g. "telemetry stalled 6 s"
    alerts: reactive[str] = reactive("")  # the service's alert rules: "2 alerts: GPU 7 at 93 °C …" (app.alerts)
    stale: reactive[str] = reactive("")  # "DB UNREACHABLE since 14:02": the bookings shown are as of then

    def validate_now(self, now: float) -> float:
        """The clock shows whole seconds: the timer's tick and telemetry's in the same second repaint once."""
        return float(int(now))

    def on_mount(self) -> None:
        """Who and where come from the app, so every screen's header says the same."""
        app = self.app
        self.host, self.user, self.admin = app.host, app.identity.name, app.identity.is_admin
        self.now = app.clock()
        self.sync()

    def sync(self) -> None:
        """The fleet, the board's trouble and the service's alerts as the app has them now (it calls this on
        every header when they change; a reactive repaints only what did)."""
        from app.tui.card_table_model import short_name

        app = self.app
        snapshot = app.fleet
        if snapshot is not None:  # what the service read, as it says: the fleet and whether it is simulated
            cards = [*snapshot.cards, *(c for other in app.hosts for c in other.snapshot.cards)]
            names = sorted({c.name for c in cards if c.name})
            hosts = f"{1 + len(app.hosts)} hosts · " if app.hosts else ""  # the fleet's, not only this host's
            self.fleet = f"{hosts}{len(cards)} × {', '.join(short_name(n) for n in names) or 'GPU'}"
            self.simulated = snapshot.simulated
        self.alert, self.alerts = app.alert, app.alerts_line
        since = app.stale_since
        self.stale = "" if since is None else f"DB UNREACHABLE since {local(since).strftime('%H:%M')}"

    def render(self) -> Text:
        style = self.get_component_rich_style
        left = self._left(fleet=True)
        right = Text()
        right.append(local(self.now).strftime("%a %d %b %H:%M:%S") if self.now else "", style("header--clock"))
        right.append("  ")
        right.append_text(untrusted(self.user, 16, style("header--user")))
        if self.admin:
            right.append(" ")
            right.append(" ADMIN ", style("header--badge-admin"))
        right.append(" ")
        width = self.size.width
        gap = width - left.cell_len - right.cell_len
        if gap < 1:  # narrow: drop the long date first
            right = Text(local(self.now).strftime("%H:%M:%S ") if self.now else "", style("header--clock"))
            right.append_text(untrusted(self.user, 10, style("header--user")))
            if self.admin:
                right.append(" ")
                right.append(" ADMIN ", style("header--badge-admin"))
            right.append(" ")
            gap = width - left.cell_len - right.cell_len
        if gap < 1 and self.stale:  # then the fleet's size, so that the database's trouble shows whole
            left = self._left(fleet=False)
            gap = width - left.cell_len - right.cell_len
        if gap < 1:
            left.truncate(max(0, width - right.cell_len - 1), overflow="ellipsis")
            gap = max(1, width - left.cell_len - right.cell_len)
        return Text.assemble(left, " " * gap, right, no_wrap=True)

    def _left(self, fleet: bool) -> Text:
        style = self.get_component_rich_style
        left = Text(" ")
        left.append_text(untrusted(self.host, 24, style("header--host")))
        if self.fleet and fleet:
            # Its own style, so the gap is a run of its own: an SVG screenshot's renderer may drop the spaces
            # that start a run (rsvg-convert drew "gpu-box8 × RTX 5090").
            left.append("  ")
            left.append(self.fleet, style("header--fleet"))
        if self.simulated:
            left.append("  ")
            left.append(" SIMULATED ", style("header--badge-simulated"))
        if self.stale:
            left.append("  ")
            left.append(f" {self.stale} ", style("header--stale"))
        if self.alert:
            left.append(f"  {self.alert}", "bold")
        if self.alerts:
            left.append("  ")
            left.append_text(untrusted(self.alerts, 80, style("header--alerts")))  # names come from other users
        return left
