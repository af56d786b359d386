"""The full parser's class, and the argument types more than one command group reads.

Loaded by app.cli.build_parser only: the quick path (app.quick) never imports argparse.
"""

from __future__ import annotations

import argparse

from app.errors import BadInput
from app.output import EXIT_BAD_INPUT


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        from app.core.text import inert  # argparse echoes stray arguments verbatim: keep them one inert line

        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {inert(message, 300)}; see '{self.prog} --help'\n")


def booking_id(text: str) -> int:
    """A booking id argument: ASCII digits in 1..2**63-1; anything else is bad input, not an SQLite overflow."""
    from app.core.parse import parse_id

    try:
        return parse_id(text)
    except BadInput as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def series_id(text: str) -> int:
    from app.core.parse import parse_id

    try:
        return parse_id(text, "series")
    except BadInput as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def card_count(text: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 4):
        raise argparse.ArgumentTypeError(f"{text[:20]!r} is not a number of cards; give 1, 2, 4 or 8")
    return int(text)


def seconds(text: str) -> float:
    """A duration argument ('90m', '2h') in seconds."""
    from app.core.timeparse import TimeInputError, parse_duration

    try:
        return parse_duration(text).total_seconds()
    except TimeInputError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def event_limit(text: str) -> int:
    value = int(text) if text.isascii() and text.isdigit() and len(text) <= 7 else 0
    if not 0 < value <= 1_000_000:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a count from 1 to 1000000")
    return value


def daemon(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """A daemon's help says how its log is written and filtered (app.cli.logs)."""
    p.description = (f"{p.description}\n\nIts log goes to stderr: under systemd each line carries its syslog priority\n"
                     "(journalctl -p warning shows the warnings and errors), elsewhere the time and the level.\n"
                     "BOARD_LOG_LEVEL=debug|info|warning|error (default info) sets the lowest level written.")
    return p
