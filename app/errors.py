"""Errors a user can act on. Each carries the CLI's documented exit code and a one-line message."""


class BoardError(Exception):
    exit_code = 1


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
