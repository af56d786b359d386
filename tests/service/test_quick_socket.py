"""The quick commands through the agent's socket, as a member's shell runs them: what they print, and that they load
nothing the request does not need (app.config with msgspec and tomllib costs more than the request itself)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.service.support import REPO

# Runs app.quick as the `board` entry point does, then says which of the watched modules (argv[1]) the command loaded.
QUICK = ("import sys\n"
         "watched = sys.argv[1].split(',')\n"
         "from app.quick import main\n"
         "rc = main(sys.argv[2:])\n"
         "print('loaded:', sorted(m for m in watched if m in sys.modules), file=sys.stderr)\n"
         "sys.exit(rc)\n")
HEAVY = ("app.config", "msgspec", "tomllib")
# What the socket and threading packages and json import: the quick path's C modules (_socket, _thread, _json) do
# without them (issue 37: json, socket and threading alone cost a read 1.4x `import sqlite3`).
STDLIB_SLOW = ("json", "re", "enum", "socket", "selectors", "threading", "typing", "dataclasses", "argparse")


def quick(agent, *args: str, watched: tuple[str, ...] = HEAVY) -> tuple[int, str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TZ": "UTC", "BOARD_CONFIG": str(agent.config)}
    result = subprocess.run([sys.executable, "-c", QUICK, ",".join(watched), *args], capture_output=True, text=True,
                            env=env, cwd=REPO, timeout=60)
    return result.returncode, result.stdout, result.stderr


def test_book_and_list_name_another_hosts_cards_by_the_configs_fleet_host_without_loading_the_config(make_agent):
    """Two hosts of one fleet (one database file): a booking made on gpu2's socket is listed on gpu1's as
    `cards gpu2:0`, gpu1's own as `cards 0`; `book` and `list`, text and --json, load neither app.config nor msgspec
    nor tomllib. Nearest wrong versions: the host read from another table ([service], [gateway]) or not at all (every
    booking unprefixed, or gpu1's own prefixed), and `book` reaching for ctx.config again (the 22 ms a booking cost
    over a read, issue 37)."""
    gpu1 = make_agent(sections={"fleet": {"host": "gpu1"}, "history": {"enabled": False}})
    gpu2 = make_agent(sections={"fleet": {"host": "gpu2"}, "history": {"enabled": False}}, shared_db=gpu1.db)
    rc, out, err = quick(gpu2, "book", "--cards", "0", "--start", "+2h", "--for", "1h")
    assert (rc, err) == (0, "loaded: []\n") and "cards 0 " in out and "gpu2:" not in out, (out, err)
    rc, out, err = quick(gpu1, "book", "--cards", "0", "--start", "+4h", "--for", "1h", "--json")
    assert (rc, err) == (0, "loaded: []\n"), err
    rc, out, err = quick(gpu1, "list")
    assert (rc, err) == (0, "loaded: []\n"), err
    lines = out.splitlines()
    assert len(lines) == 2 and "cards gpu2:0 " in lines[0] and "cards 0 " in lines[1], out


def test_status_through_the_socket_loads_no_json_re_enum_socket_or_threading_package(make_agent):
    """`board status --json` and `whoami --json` through a real agent print what json.dumps(indent=2) prints and load
    none of json (re, enum), socket (selectors), threading, typing, dataclasses or argparse; `book --json` and `list`
    load no json, socket or threading either (their time words need re). Nearest wrong versions: app.output printing
    through json.dumps again, the client back on socket.socket and makefile, threading.Lock for its lock."""
    agent = make_agent(sections={"history": {"enabled": False}})
    for args in (("status", "--json"), ("whoami", "--json")):
        rc, out, err = quick(agent, *args, watched=HEAVY + STDLIB_SLOW)
        assert (rc, err) == (0, "loaded: []\n"), (args, err)
        assert out == json.dumps(json.loads(out), indent=2) + "\n"
    rc, out, err = quick(agent, "status", watched=HEAVY + STDLIB_SLOW)  # the table words times: re, enum
    assert rc == 0 and "json" not in err and "socket" not in err and "threading" not in err, err
    for args in (("book", "--cards", "0", "--start", "+2h", "--for", "1h", "--json"), ("list",)):
        rc, out, err = quick(agent, *args, watched=HEAVY + ("json", "socket", "selectors", "threading"))
        assert (rc, err) == (0, "loaded: []\n"), (args, err)
    assert json.loads(quick(agent, "list", "--json")[1])["bookings"][0]["cards"] == [0]
