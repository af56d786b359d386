"""Help: every key, from app.tui.keys."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from app.tui.keys import KEYS
from app.tui.node import BoardNode


class HelpModal(BoardNode, ModalScreen[None]):
    DEFAULT_CSS = """
    HelpModal { align: center middle; }
    HelpModal > VerticalScroll {
        width: 80; max-width: 100%; height: auto; max-height: 100%;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    """
    BINDINGS = [Binding("escape,q,question_mark", "close", "Close")]

    def __init__(self, admin: bool) -> None:
        super().__init__()
        self.admin = admin

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 1))
        table.add_column(style="bold", no_wrap=True)
        table.add_column(no_wrap=True)
        table.add_column()
        for where, keys, what in KEYS:
            if (keys == "a" and not self.admin) or (where == "admin" and not self.admin):
                continue
            table.add_row(Text(keys), Text(where, "dim"), Text(what))
        with VerticalScroll():
            yield Static(Text("Keys · escape closes", "bold"))
            yield Static(table)

    def action_close(self) -> None:
        self.dismiss(None)
