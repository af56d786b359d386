"""The baseline for bench_tui.py: a minimal Textual app with a Header, a Footer and a 1 s clock."""

from __future__ import annotations

import time

from textual.app import App, ComposeResult
from textual.widgets import Footer, Header, Static


class MinimalApp(App):
    BINDINGS = [("q", "quit", "Quit")]

    def compose(self) -> ComposeResult:
        yield Header(show_clock=True)
        yield Static(id="clock")
        yield Footer()

    def on_mount(self) -> None:
        self.set_interval(1.0, self.tick)

    def tick(self) -> None:
        self.query_one("#clock", Static).update(time.strftime("%H:%M:%S"))


if __name__ == "__main__":
    MinimalApp().run()
