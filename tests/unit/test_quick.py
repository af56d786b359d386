"""The quick path parses each quick command exactly as the full CLI does, and finds the socket as tomllib would."""

from __future__ import annotations

import tomllib

import pytest

from app.cli import build_parser
from app.config_file import scan_socket
from app.quick import QUICK, parse

AGREE = [
    ["status"], ["status", "--json"], ["whoami", "--json"],
    ["book", "2", "--for", "3h"], ["book", "--cards", "0,1", "--start", "tomorrow 9-19", "--json"],
    ["book", "1", "--for=90m", "--class", "batch", "--note", "eval run"], ["book", "--cards=4-7", "--until", "18:00"],
    ["list"], ["list", "--mine", "--all"], ["list", "--user", "alice", "--from", "mon 9:00", "--to", "+2d", "--json"],
    ["cancel", "12"], ["release", "7", "--json"],
]
FULL_CLI_ONLY = [
    [], ["book"] + ["--help"], ["status", "--db", "x.db"], ["status", "--demo"], ["book", "2", "--for", "1h", "--until", "2h"],
    ["list", "--mine", "--user", "bob"], ["cancel"], ["cancel", "٣"], ["cancel", "-1"], ["book", "--note", "-x", "1"],
    ["book", "2", "3"], ["status", "extra"], ["extend", "1", "--for", "1h"], ["book", "--cards"], ["serve", "list"],
]


@pytest.mark.parametrize("argv", AGREE, ids=" ".join)
def test_quick_parse_matches_argparse(argv):
    quick = parse(argv)
    full = vars(build_parser().parse_args(argv))
    assert quick is not None
    assert vars(quick) == {key: full[key] for key in vars(quick)}


@pytest.mark.parametrize("argv", FULL_CLI_ONLY, ids=lambda a: " ".join(a) or "(none)")
def test_anything_unsure_goes_to_the_full_cli(argv):
    assert parse(argv) is None


def test_every_quick_command_exists_in_the_full_cli():
    full = build_parser()
    for command in QUICK:
        assert full.parse_args([command, *(["1"] if QUICK[command][2] else [])]).handler.__name__ == f"cmd_{command}"


CONFIGS = [
    '[service]\nsocket = "/run/board/board.sock"\ngroup = "board"\n',
    '[storage]\ndb = "/var/lib/board/board.db"\n\n[service]\n# the members\' door\nsocket = "/x/y.sock"  # here\n',
    '[ service ]\nsocket = "/spaced"\n',
    '[llama]\nsocket = "/not/this"\n[service]\ngroup = "board"\n',
    '[access]\nadmin_group = "board-admin"\n',
    '',
    "[service]\nsocket = '/literal'\n",
    '[service]\nsocket = "/esc\\\\aped"\n',
    'service.socket = "/dotted"\n',
    'service = { socket = "/inline" }\n',
    '[service]\nsocket = """/multi"""\n',
    '[llama]\nnote = """\n[service]\nsocket = "/fooled"\n"""\n',
    '[[pools]]\nname = "prod"\ncards = [0, 1]\n[service]\nsocket = "/after/pools"\n',
]


@pytest.mark.parametrize("text", CONFIGS)
def test_the_line_scan_agrees_with_tomllib_or_steps_aside(text):
    found = scan_socket(text)
    if found is not None:
        assert found == tomllib.loads(text).get("service", {}).get("socket", "")


def test_the_line_scan_reads_the_installed_config():
    assert scan_socket(CONFIGS[0]) == "/run/board/board.sock"
    assert scan_socket(CONFIGS[11]) is None  # a multi-line string could hide a fake table: tomllib decides
