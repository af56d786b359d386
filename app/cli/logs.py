"""The daemons' log (`board agent`, `board gateway`, `board runner`): `logging`, set up once as each starts.

Each module logs to its own `logging.getLogger(__name__)`, at the level its line deserves. Under systemd, where
stderr is the journal's stream (JOURNAL_STREAM names its device and inode, systemd.exec(5)), a line starts with
the syslog priority journald reads (`<4>` a warning, `<3>` an error: sd-daemon(3)) and has no time (journald
stamps it), so `journalctl -p warning` finds the warnings. Anywhere else (a terminal, a file) a line is the local
time, the level's name and the message. BOARD_LOG_LEVEL (debug, info, warning, error; default info) says from
which level lines are written. The command line's one-line errors for people stay prints: only the daemons import
this module, and with it `logging`.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import TextIO

from app.core.text import inert
from app.errors import BadInput

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
# syslog's priorities (sd-daemon(3)), from the highest level down: a level between two takes the lower's
PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4), (logging.INFO, 6))


def priority(level: int) -> int:
    return next((said for at_least, said in PRIORITIES if level >= at_least), 7)


def to_journal(environ: Mapping[str, str], stream: TextIO) -> bool:
    """True when `stream` is the journal's: JOURNAL_STREAM is its "device:inode". A child whose stderr was sent
    elsewhere inherits the variable but not the stream, so the variable alone is not enough."""
    device, _, inode = environ.get("JOURNAL_STREAM", "").partition(":")
    try:
        info = os.fstat(stream.fileno())
        return (info.st_dev, info.st_ino) == (int(device), int(inode))
    except (ValueError, OSError):  # unset or garbled, or a stream with no file (io.UnsupportedOperation is both)
        return False


class Lines(logging.Formatter):
    """One line per record, its control characters made visible (a message cannot forge a second line, or a
    priority), cut at `limit` characters."""

    def __init__(self, journal: bool, limit: int | None = None) -> None:
        super().__init__(datefmt="%Y-%m-%d %H:%M:%S")
        self.journal, self.limit = journal, limit

    def format(self, record: logging.LogRecord) -> str:
        text = inert(record.getMessage(), self.limit)
        if record.exc_info:  # a library's traceback (aiohttp's): on the same line
            text += " " + inert(self.formatException(record.exc_info))
        if self.journal:
            return f"<{priority(record.levelno)}>{text}"
        return f"{self.formatTime(record, self.datefmt)} {record.levelname} {text}"


def start_logging(environ: Mapping[str, str], limit: int | None = None, stream: TextIO | None = None) -> None:
    """A daemon's log on stderr (`stream`), from BOARD_LOG_LEVEL up; called again, it replaces its handler."""
    name = environ.get("BOARD_LOG_LEVEL", "info").strip().lower()
    if name not in LEVELS:
        raise BadInput(f"BOARD_LOG_LEVEL is {inert(name, 40)!r}; give one of {', '.join(LEVELS)}")
    stream = stream if stream is not None else sys.stderr
    handler = logging.StreamHandler(stream)
    handler.setFormatter(Lines(to_journal(environ, stream), limit))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h.formatter, Lines)]:  # not the ones pytest adds
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(LEVELS[name])
