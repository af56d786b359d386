"""The quick commands through the agent's socket, as a member's shell runs them: what they print, and that they load
nothing the request does not need (app.config with msgspec and tomllib costs more than the request itself)."""

from __future__ import annotations

import subprocess
import sys

from tests.service.support import REPO

# Runs app.quick as the `board` entry point does, then says which heavy modules the command loaded.
QUICK = ("import sys\n"
         "from app.quick import main\n"
         "rc = main(sys.argv[1:])\n"
         "print('loaded:', sorted(m for m in ('app.config', 'msgspec', 'tomllib') if m in sys.modules), file=sys.stderr)\n"
         "sys.exit(rc)\n")


def quick(agent, *args: str) -> tuple[int, str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TZ": "UTC", "BOARD_CONFIG": str(agent.config)}
    result = subprocess.run([sys.executable, "-c", QUICK, *args], capture_output=True, text=True, env=env, cwd=REPO,
                            timeout=60)
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
