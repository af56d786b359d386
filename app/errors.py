"""Errors a user can act on. Each carries the CLI's documented exit code and a one-line message."""

from __future__ import annotations

from collections.abc import Callable  # loaded at start-up already: the quick path pays nothing


class BoardError(Exception):
    exit_code = 1
    # A refusal's second half (the earliest start that works) is worded only when the message is shown: the socket
    # client sets `rest` to a function that asks the service for it (op `earliest`), and the first str() calls it.
    rest: Callable[[], str | None] | None = None

    def __str__(self) -> str:
        if self.rest is not None:
            rest, self.rest = self.rest, None
            try:
                more = rest()
            except (BoardError, OSError):  # the service went away meanwhile: the first half still says why
                more = None
            if more and self.args:
                self.args = (f"{self.args[0]}; {more}", *self.args[1:])
        return super().__str__()


class BadInput(BoardError):
    """Bad input, or the thing named does not exist."""

    exit_code = 2


class Conflict(BoardError):
    exit_code = 3


class NotPermitted(BoardError):
    exit_code = 4


class ServiceDown(BoardError):
    """The board service does not answer on its socket; never fall back to the file."""


def error_for(code: int, message: str) -> BoardError:
    """The error a reply's exit-code class stands for, so a client raises what the service raised."""
    kind = {2: BadInput, 3: Conflict, 4: NotPermitted}.get(code, BoardError)
    return kind(message)
