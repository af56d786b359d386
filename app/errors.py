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
