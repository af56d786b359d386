"""`BoardNode`: mixed into the board's screens and widgets (first among the bases), so that the type checker knows
`self.app` for the `BoardApp` it is, with its attributes (`clock`, `backend`, `fleet_host`, ...). Typed once, here,
the way Textual offers (`textual.getters.app`), for the type checker only: at run time `app` stays Textual's own
property, so a plain `App` hosting one widget in a test still works."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from textual import getters
    from textual.message_pump import MessagePump

    from app.tui.app import BoardApp

    _Node = MessagePump
else:
    _Node = object  # at run time the mixin adds nothing


class BoardNode(_Node):
    if TYPE_CHECKING:
        app = getters.app(BoardApp)
