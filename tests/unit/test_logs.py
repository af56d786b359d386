"""The daemons' log (app/cli/logs.py): journald's priorities under systemd, the time and the level elsewhere, the
level BOARD_LOG_LEVEL names. Each test writes to a real file, as a daemon's stderr is one."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import pytest

from app.cli.logs import start_logging
from app.errors import BadInput

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


@pytest.fixture
def written(tmp_path, daemon_log):
    """log(environ): start_logging on a real file as stderr, a line at each level from app.service.door.server's logger;
    returns the file's lines. The root logger is left as it was (the daemon_log fixture)."""

    opened = []

    def log(environ: dict, path: Path = tmp_path / "stderr") -> list[str]:
        opened.append(stream := path.open("a"))
        start_logging({key: value(path) if callable(value) else value for key, value in environ.items()}, stream=stream)
        logger = logging.getLogger("app.service.door.server")
        logger.debug("board agent: a detail")
        logger.info("board agent: serving")
        logger.warning("board agent: can't accept connections")
        logger.error("enforcement pass failed: OSError")
        logging.getLogger("app.cli.runner").critical("board runner: critical")
        return path.read_text().splitlines()

    yield log
    for stream in opened:
        stream.close()


def journal(path: Path) -> str:
    """JOURNAL_STREAM as systemd sets it for a unit whose stderr is `path`."""
    info = os.stat(path)
    return f"{info.st_dev}:{info.st_ino}"


def test_on_the_journals_stream_each_line_starts_with_its_syslog_priority_and_has_no_time(written, tmp_path):
    """Under systemd (stderr is the stream JOURNAL_STREAM names) a warning starts with <4>, an error <3>, an info <6>,
    critical <2>, and no line carries a time (journald stamps each). Control characters stay on their line: a message
    cannot forge a second entry with a priority of its own.
    Wrong versions: the priorities off by one (<5> for a warning, <4> for an error) or one for all; the time or the
    level's name still written; JOURNAL_STREAM ignored; a newline in a message written as one."""
    assert written({"JOURNAL_STREAM": journal}) == [
        "<6>board agent: serving", "<4>board agent: can't accept connections", "<3>enforcement pass failed: OSError",
        "<2>board runner: critical"]
    logging.getLogger("app.gateway.server").warning("board gateway: a\n<3>forged")
    assert (tmp_path / "stderr").read_text().splitlines()[-1] == "<4>board gateway: a\\x0a<3>forged"


def test_elsewhere_a_line_is_the_time_the_level_and_the_message(written, tmp_path):
    """On a terminal or a file (no JOURNAL_STREAM), and where JOURNAL_STREAM names another stream than stderr (a child
    whose stderr was sent elsewhere inherits the variable): the local time, the level's name, the message; no priority.
    Wrong versions: the priority prefix on a terminal, or wherever JOURNAL_STREAM is set (the variable alone taken
    for the journal); no time; no level."""
    expected = [("INFO", "board agent: serving"), ("WARNING", "board agent: can't accept connections"),
                ("ERROR", "enforcement pass failed: OSError"), ("CRITICAL", "board runner: critical")]
    for environ, path in (({}, tmp_path / "plain"), ({"JOURNAL_STREAM": journal(tmp_path)}, tmp_path / "inherited"),
                          ({"JOURNAL_STREAM": "garbled"}, tmp_path / "garbled")):
        lines = written(environ, path)
        assert [re.fullmatch(rf"{STAMP} (\w+) (.*)", line).groups() for line in lines] == expected, (environ, lines)


def test_board_log_level_says_from_which_level_lines_are_written(written, tmp_path):
    """BOARD_LOG_LEVEL: debug writes the DEBUG line (<7> in the journal), the default (info) does not, warning leaves
    out the INFO line too; a level given in capitals is the same level; an unknown one is bad input naming the variable
    and the levels, and changes nothing.
    Wrong versions: the variable ignored (always INFO, or always everything); DEBUG given the priority of INFO;
    an unknown level taken as the default without a word."""
    assert written({"JOURNAL_STREAM": journal, "BOARD_LOG_LEVEL": "debug"}, tmp_path / "journal")[0] == (
        "<7>board agent: a detail")
    assert [line.split(" ", 3)[2] for line in written({}, tmp_path / "default")] == [
        "INFO", "WARNING", "ERROR", "CRITICAL"]
    assert [line.split(" ", 3)[2] for line in written({"BOARD_LOG_LEVEL": "WARNING"}, tmp_path / "warning")] == [
        "WARNING", "ERROR", "CRITICAL"]
    with pytest.raises(BadInput, match=r"^BOARD_LOG_LEVEL is 'loud'; give one of debug, info, warning, error$"):
        start_logging({"BOARD_LOG_LEVEL": "loud"})
    assert logging.getLogger().getEffectiveLevel() == logging.WARNING  # as the last start left it


def test_a_second_start_replaces_the_daemons_handler_and_leaves_the_others(written, tmp_path, caplog):
    """Started twice (a test, or a command that starts a daemon after another), a line is written once, to the
    latest stream; a handler someone else added (pytest's) stays.
    Wrong versions: a handler added at each start (every line twice); all the root's handlers replaced."""
    written({}, tmp_path / "first")
    written({}, tmp_path / "second")
    assert len((tmp_path / "first").read_text().splitlines()) == 4
    assert len((tmp_path / "second").read_text().splitlines()) == 4
    assert caplog.handler in logging.getLogger().handlers
