"""The quick path parses each quick command exactly as the full CLI does, and finds the socket as tomllib would."""

from __future__ import annotations

import tomllib

import pytest

from app.cli import build_parser
from app.config_file import scan_string
from app.quick import QUICK, handler, parse

AGREE = [
    ["status"], ["status", "--json"], ["status", "--short"], ["whoami", "--json"],
    ["book", "2", "--for", "3h"], ["book", "--cards", "0,1", "--start", "tomorrow 9-19", "--json"],
    ["book", "1", "--for=90m", "--class", "batch", "--note", "eval run"], ["book", "--cards=4-7", "--until", "18:00"],
    ["list"], ["list", "--mine", "--all"], ["list", "--user", "alice", "--from", "mon 9:00", "--to", "+2d", "--json"],
    ["cancel", "12"], ["release", "7", "--json"],
]
FULL_CLI_ONLY = [
    [], ["book"] + ["--help"], ["status", "--db", "x.db"], ["status", "--demo"], ["book", "2", "--for", "1h", "--until", "2h"],
    ["list", "--mine", "--user", "bob"], ["cancel"], ["cancel", "٣"], ["cancel", "-1"], ["book", "--note", "-x", "1"],
    ["book", "2", "3"], ["status", "extra"], ["extend", "1", "--for", "1h"], ["book", "--cards"], ["serve", "list"],
    ["status", "--short", "--json"],
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


def test_every_quick_command_runs_the_full_clis_handler():
    full = build_parser()
    for command in QUICK:
        assert full.parse_args([command, *(["1"] if QUICK[command][2] else [])]).handler is handler(command)


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


FLEET_CONFIGS = [
    '[fleet]\nhost = "gpu1"\n', '[service]\nsocket = "/s"\n[fleet]\nhost = "gpu2"  # this box\n',
    'fleet.host = "dotted"\n', 'fleet = { host = "inline" }\n', "[fleet]\nhost = 'literal'\n",
    '[gateway]\nhost = "not-this"\n[fleet]\nheartbeat_timeout_s = 30\n',
]


@pytest.mark.parametrize("text", CONFIGS + FLEET_CONFIGS)
@pytest.mark.parametrize("setting", [("service", "socket"), ("fleet", "host")], ids="_".join)
def test_the_line_scan_agrees_with_tomllib_or_steps_aside(text, setting):
    """Wrong versions: the scan reading `host` in any table, or a top-level `fleet = {...}` as no host."""
    table, key = setting
    found = scan_string(text, table, key)
    if found is not None:
        assert found == tomllib.loads(text).get(table, {}).get(key, "")


def test_the_line_scan_reads_the_installed_config():
    assert scan_string(CONFIGS[0], "service", "socket") == "/run/board/board.sock"
    assert scan_string(CONFIGS[11], "service", "socket") is None  # a multi-line string could hide a fake table
    assert scan_string(FLEET_CONFIGS[1], "fleet", "host") == "gpu2"
    assert scan_string(FLEET_CONFIGS[5], "fleet", "host") == ""  # [gateway] host is another setting


def test_the_socket_path_loads_nothing_heavy():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import app.quick, app.cli.context, app.cli.status, app.cli.bookings, app.output, app.client.socket\n"
        "import app.config_file, app.core.text, app.core.parse, app.core.timeparse\n"
        "heavy = {'argparse', 'dataclasses', 'tomllib', 'sqlite3', 'typing', 'textual', 'psutil', 'pynvml',\n"
        "         'app.config', 'app.service', 'app.store', 'app.cli.arguments', 'app.fit',\n"
        "         'json', 'socket', 'selectors', 'threading'}\n"  # app.wire and the client use their C modules
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_both_clients_offer_the_one_interface():
    from app.client.interface import Client
    from app.client.local import LocalClient
    from app.client.socket import SocketClient

    for kind in (LocalClient, SocketClient):
        for name in ("call", "subscribe", "close"):
            assert callable(getattr(kind, name)), (kind, name)
        assert kind.transport in ("local", "socket")
    assert {"call", "subscribe", "close"} <= set(vars(Client))
