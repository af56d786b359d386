"""BoardFooter (app.tui.widgets.footer): Textual's footer, rebuilt only when the keys it shows change."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from app.tui.widgets.footer import BoardFooter
from tests.tui.conftest import ready, wait_for


def counting_rebuilds(monkeypatch) -> list[int]:
    """Each real rebuild of a footer's keys (Textual's Footer.recompose, which BoardFooter calls when it rebuilds)."""
    rebuilds: list[int] = []
    rebuild = Footer.recompose

    async def counted(self) -> None:
        rebuilds.append(1)
        await rebuild(self)

    monkeypatch.setattr(Footer, "recompose", counted)
    return rebuilds


class Keys(App):
    BINDINGS = [("b", "book", "Book")]
    ENABLE_COMMAND_PALETTE = False

    def compose(self) -> ComposeResult:
        yield BoardFooter()

    def action_book(self) -> None:
        pass

    def action_again(self) -> None:
        pass


def shown(app: App) -> dict[str, bool]:
    """{description: enabled} of the footer's keys."""
    return {key.description: not key.disabled for key in app.query(FooterKey) if key.description}


async def test_the_board_builds_its_footer_keys_once_as_it_starts(make_app, monkeypatch):
    """Wrong version this fails on: Textual's own Footer (it rebuilt its keys at each of the three binding refreshes
    of the start: the focus set, the screen's stack, an idle callback)."""
    rebuilds = counting_rebuilds(monkeypatch)
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        assert {"Quit", "Book", "Mine", "Help", "Servers", "Now", "Zoom"} <= set(shown(pilot.app))
    assert len(rebuilds) == 1


async def test_the_footer_rebuilds_when_a_key_is_added_and_only_then(monkeypatch):
    """Wrong versions this fails on: a footer that never rebuilds once built; one that rebuilds at every refresh of
    the bindings (Textual's)."""
    rebuilds = counting_rebuilds(monkeypatch)
    app = Keys()
    async with app.run_test(size=(60, 5)) as pilot:
        await wait_for(pilot, lambda: shown(app) == {"Book": True})
        built = len(rebuilds)
        app.screen.refresh_bindings()  # nothing changed: no rebuild
        app.bind("x", "again", description="Book")
        app.screen.refresh_bindings()
        await wait_for(pilot, lambda: [key.key for key in app.query(FooterKey)] == ["b", "x"])
        assert len(rebuilds) == built + 1  # the added key's, not the first refresh's
