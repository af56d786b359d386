"""The board's footer: Textual's, rebuilt only when the keys it shows change."""

from __future__ import annotations

from textual.widgets import Footer


class BoardFooter(Footer):
    """Textual's Footer rebuilds its keys on every refresh of the screen's bindings; as the board starts, three
    of them (the focus set, the screen's stack, an idle callback) rebuilt and styled its nine keys three times
    over, a tenth of the CPU before the first paint. This one rebuilds when what compose would show differs."""

    _shown: tuple | None = None

    def _what_it_shows(self) -> tuple:
        """Everything Footer.compose reads: each binding shown, its display, group, state and tooltip."""
        app = self.app
        return (self.show_command_palette, app.ENABLE_COMMAND_PALETTE, app.COMMAND_PALETTE_BINDING,
                tuple((binding.key, app.get_key_display(binding), binding.description, binding.action, binding.show,
                       binding.group, enabled, tooltip)
                      for (_, binding, enabled, tooltip) in self.screen.active_bindings.values()))

    async def recompose(self) -> None:
        if not self._bindings_ready or not self.is_attached:
            return await super().recompose()
        shown = self._what_it_shows()
        if shown == self._shown:
            return
        self._shown = shown
        await super().recompose()
