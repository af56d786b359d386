"""`board models [--json]`: the team's catalog ([[models]]) as the real agent sees it, on its socket, through the real
CLI as root and as a member; each state that can be reached without a GPU: cold, starting (booked, planned, its
server handed to the runner and not up), failed (the runner could not start it), preloaded (inside its window,
woken with no request). The runner here is a stand-in that speaks the runner's protocol as the user board-llama
(registers, hears `start`, answers `failed` for an alias ending in -fails): a real llama-server start is
tests/llama's and bench/bench_cold_start.py's. The wording of each state is held by a table of replies below.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time

import pytest

from app.cli.models import NO_CATALOG, models_text, state_text
from tests.service.conftest import make_agent  # noqa: F401 - the fixture
from tests.service.support import board_cli, check_reachable, run_as
from tests.unix_users import MEMBERS_GROUP, RUNNER_USER, as_user, ensure_system_user, ensure_unix_users
from tests.llama.tiny_gguf import write_tiny_gguf

pytestmark = pytest.mark.real_users

CATALOG = """
[llama]
model_dirs = ["{models}"]
server_bin = "/bin/true"  # the service checks it is there; the stand-in runner never runs it

[enforce]
interval_s = 0.5

[[models]]
alias = "tiny-cold"
model = "{model}"
ctx = 256
fallbacks = ["tiny-starts"]

[[models]]
alias = "tiny-starts"
model = "{model}"
ctx = 256

[[models]]
alias = "tiny-fails"
model = "{model}"
ctx = 256

[[models]]
alias = "tiny-warm"
model = "{model}"
ctx = 256
preload = {{hours = "00:00-24:00", days = "mon-sun"}}
"""

# The runner's side of the wire (app/cli/runner.py), as board-llama: each `start` printed as a JSON line, which the
# test reads to know the service sent it; an alias ending in -fails answered `failed`, as the runner does when it
# cannot launch.
STAND_IN = r"""
import json, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
sock.sendall(json.dumps({"v": 1, "id": 1, "op": "register", "args": {"kind": "runner"}}).encode() + b"\n")
reader = sock.makefile("rb")
print(json.dumps(json.loads(reader.readline())), flush=True)
for line in reader:
    message = json.loads(line)
    if message.get("event") != "start":
        continue
    server = message["server"]
    if server["alias"].endswith("-fails"):
        sock.sendall(json.dumps({"event": "failed", "server": server["id"],
                                 "reason": "the runner: no llama-server here"}).encode() + b"\n")
    print(json.dumps({"server": server["id"], "alias": server["alias"]}), flush=True)
"""


class Catalog:
    """The real agent with CATALOG, its members' group boardusers; `board` as root or as a member."""

    def __init__(self, agent) -> None:
        self.agent = agent
        self.runner: subprocess.Popen | None = None
        self.started: dict[str, int] = {}  # alias -> the server the runner was told to start
        self.lines: queue.Queue[str] = queue.Queue()  # the stand-in's stdout

    def cli(self, *args: str, user: str = "root") -> tuple[int, str, str]:
        env = {"BOARD_CONFIG": str(self.agent.config), "HOME": "/tmp"}
        if user == "root":
            return board_cli(*args, env=env)
        result = run_as(user, str(sys.prefix + "/bin/board"), *args,
                        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "TZ": "UTC", **env})
        return result.returncode, result.stdout, result.stderr

    def models(self, user: str = "root") -> dict[str, dict]:
        rc, out, err = self.cli("models", "--json", user=user)
        assert (rc, err) == (0, ""), err
        return {m["alias"]: m for m in json.loads(out)["models"]}

    def start_runner(self) -> None:
        self.runner = subprocess.Popen(as_user(RUNNER_USER, [sys.executable, "-c", STAND_IN, str(self.agent.socket)]),
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
        # Its lines through a queue: a timed wait on a pipe that Python buffers would miss lines read ahead.
        threading.Thread(target=lambda: [self.lines.put(line) for line in self.runner.stdout], daemon=True).start()
        registered = json.loads(self.lines.get(timeout=30))
        assert registered.get("ok"), registered

    def wait_start(self, alias: str, timeout: float = 30) -> int:
        """The server the service told the runner to start for `alias` (read from the stand-in, in order)."""
        deadline = time.monotonic() + timeout
        while alias not in self.started:
            try:
                told = json.loads(self.lines.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"no start for {alias} in {timeout:g} s:\n{self.agent.log_text()}") from None
            self.started[told["alias"]] = told["server"]
        return self.started[alias]

    def wait_state(self, alias: str, state: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while (found := self.models()[alias])["state"] != state:
            assert time.monotonic() < deadline, (found, self.agent.log_text())
            time.sleep(0.1)
        return found

    def close(self) -> None:
        if self.runner is not None:
            self.runner.kill()
            self.runner.wait(10)


@pytest.fixture
def catalog(make_agent, tmp_path):  # noqa: F811 - make_agent is the fixture imported above
    ensure_unix_users()
    ensure_system_user(RUNNER_USER, MEMBERS_GROUP)
    for user in ("alice", RUNNER_USER):
        check_reachable(user)
    agent = make_agent(service={"group": MEMBERS_GROUP}, start=False)
    models = agent.root / "models"
    models.mkdir(mode=0o755)
    model = write_tiny_gguf(models / "tiny.gguf")
    model.chmod(0o644)
    agent.config.write_text(agent.config.read_text() + CATALOG.format(models=models, model=model))
    agent.start()
    made = Catalog(agent)
    yield made
    made.close()


def test_each_state_a_board_without_a_gpu_reaches(catalog):
    """Cold (nothing booked; the preloaded entry cold too while no runner can start it), then with a runner: the
    preloaded one starting unasked, an asked one starting on the cards its booking holds, one the runner could not
    start failed; the text says each as the table below words it. Wrong versions: a cold entry with a booking or
    cards, `preloaded` false inside an all-day window (or true outside one: the others), a starting entry without
    its booking's cards, failed reported as starting (the runner's answer ignored), the catalog out of its order."""
    before = catalog.models()
    assert list(before) == ["tiny-cold", "tiny-starts", "tiny-fails", "tiny-warm"]
    for alias, m in before.items():
        assert (m["state"], m["booking"], m["server"], m["cards"], m["since"]) == ("cold", None, None, [], None), m
        assert (m["cards_needed"], m["requests_today"], m["tokens_today"]) == (1, 0, 0), m
        assert m["preloaded"] is (alias == "tiny-warm"), m
    assert before["tiny-cold"]["fallbacks"] == ["tiny-starts"]
    assert before["tiny-warm"]["preload"] == {"hours": "00:00-24:00", "days": "mon-sun"}

    catalog.start_runner()
    warm_server = catalog.wait_start("tiny-warm")  # the enforcement's pass wakes it: no request
    warm = catalog.models()["tiny-warm"]
    assert (warm["state"], warm["server"], warm["preloaded"]) == ("starting", warm_server, True), warm

    from app.client.socket import SocketClient

    root = SocketClient(str(catalog.agent.socket))
    try:
        asked = root.call("model_demand", alias="tiny-starts")  # as the gateway asks, on a first request
        assert asked["state"] == "starting", asked
        catalog.wait_start("tiny-starts")
        assert root.call("model_demand", alias="tiny-fails")["state"] == "starting"
    finally:
        root.close()
    catalog.wait_start("tiny-fails")
    failed = catalog.wait_state("tiny-fails", "failed")
    starting = catalog.models(user="alice")["tiny-starts"]  # any member reads it
    assert (starting["state"], starting["booking"], len(starting["cards"])) == ("starting", asked["booking"], 1)
    assert starting["cards"] == asked["cards"] and starting["since"] is not None, starting
    assert catalog.models()["tiny-cold"]["state"] == "cold"

    rc, out, err = catalog.cli("models", user="alice")
    assert (rc, err) == (0, "")
    rows = {line.split()[0]: line for line in out.splitlines()[1:5]}  # the table, under its header
    assert f"starting on cards {starting['cards'][0]} " in rows["tiny-starts"]
    assert f"failed (server {failed['server']}: board serve logs {failed['server']})" in rows["tiny-fails"]
    assert f"starting on cards {warm['cards'][0]} (preloaded)" in rows["tiny-warm"]
    assert rows["tiny-cold"].split()[:2] == ["tiny-cold", "cold"]
    assert "tiny-cold falls back to tiny-starts" in out and "tiny-warm is kept warm mon-sun 00:00-24:00" in out


def test_the_json_is_the_documented_shape(catalog):
    """docs/json.md's example against what `board models --json` prints here, key for key (the demo, with no
    catalog, prints an empty list: tests/unit/test_json_docs.py leaves the entries to this test). Wrong versions: a
    key printed and not documented or the other way round, `since` an epoch where every other --json prints ISO."""
    from tests.unit.test_json_docs import Reader, example, mismatches

    catalog.start_runner()
    catalog.wait_start("tiny-warm")
    rc, out, err = catalog.cli("models", "--json")
    assert (rc, err) == (0, "")
    printed = json.loads(out)
    shape = Reader(example("json.md", "`board models --json` prints one object:")).shape()
    assert mismatches(shape, printed, "", set()) == []
    warm = printed["models"][3]
    assert warm["since"].endswith("+00:00") and warm["last_used"] is None, warm  # the CLI's zone: TZ=UTC


def test_requests_and_tokens_today_are_the_aliass_own(catalog):
    """The gateway's records for an alias since midnight: its requests and its prompt and completion tokens. Wrong
    versions: another alias's records counted, a record from two days ago counted, only completion tokens."""
    from app.client.socket import SocketClient

    now = int(time.time())
    record = {"status": 200, "fingerprint": "fp", "user": "alice", "duration_ms": 10}
    root = SocketClient(str(catalog.agent.socket))
    try:
        root.call("gateway_usage", records=[
            {**record, "ts": now, "model": "tiny-cold", "prompt_tokens": 7, "completion_tokens": 5},
            {**record, "ts": now, "model": "tiny-cold", "prompt_tokens": 1, "completion_tokens": 2},
            {**record, "ts": now, "model": "tiny-starts", "prompt_tokens": 100, "completion_tokens": 100},
            {**record, "ts": now - 2 * 86400, "model": "tiny-cold", "prompt_tokens": 1000, "completion_tokens": 0},
        ])
    finally:
        root.close()
    found = catalog.models()["tiny-cold"]
    assert (found["requests_today"], found["tokens_today"]) == (2, 15), found


def test_a_board_without_a_catalog_says_so_and_how_to_add_one(make_agent):  # noqa: F811
    """Exit 0 and one line (a member on a board with no [[models]]); --json an empty list. Wrong version: an empty
    table (a header and nothing under it), or exit 2 as though asking were a mistake."""
    agent = make_agent()
    env = {"BOARD_CONFIG": str(agent.config), "HOME": "/tmp"}
    assert board_cli("models", env=env) == (0, NO_CATALOG + "\n", "")
    assert board_cli("models", "--json", env=env) == (0, '{\n  "models": []\n}\n', "")


# -- the wording, from replies as the service sends them -----------------------------------------------------------

BASE = {"alias": "qwen-7b", "model": "/models/q.gguf", "pool": None, "project": "search", "class": "online",
        "ttl_s": 600.0, "preload": None, "fallbacks": [], "cards_needed": 2, "state": "cold", "preloaded": False,
        "booking": None, "server": None, "cards": [], "since": None, "last_used": None, "idle_s": None,
        "requests_today": 0, "tokens_today": 0}


@pytest.mark.parametrize("fields, worded", [
    ({}, "cold"),
    ({"preloaded": True}, "cold (preloaded)"),
    ({"state": "starting", "cards": [2, 3], "booking": 4, "server": 9}, "starting on cards 2-3"),
    ({"state": "ready", "cards": [2, 3], "idle_s": 240}, "ready on cards 2-3, idle 4 min"),
    ({"state": "ready", "cards": [0, 1, 2, 3, 6], "idle_s": 59}, "ready on cards 0-3,6, idle under 1 min"),
    ({"state": "ready", "cards": [5], "idle_s": 60}, "ready on cards 5, idle 1 min"),
    ({"state": "ready", "cards": [5], "idle_s": None, "preloaded": True}, "ready on cards 5 (preloaded)"),
    ({"state": "ready", "cards": [5], "idle_s": 3 * 3600}, "ready on cards 5, idle 3 h"),
    ({"state": "draining", "cards": [4]}, "draining on cards 4"),
    ({"state": "failed", "cards": [4], "server": 12}, "failed (server 12: board serve logs 12)"),
    ({"state": "failed"}, "failed"),
])
def test_each_state_worded(fields, worded):
    """Wrong versions: the idle time in seconds or missing, the cards as a list (2,3) where people type 2-3, under a
    minute said as 'now' (it reads as in use), 'preloaded' left off, a failed entry with no way to its log."""
    assert state_text({**BASE, **fields}) == worded


def test_the_admins_text_is_shown_inert():
    """A project's name is the admin's ([[projects]]) and the config refuses control characters, but the table
    does not lean on that: an escape would reach the terminal. Wrong version: the project printed raw."""
    text = models_text([{**BASE, "project": "ops\x1b[31m\u202e", "fallbacks": ["b\x07"]}])
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    assert "ops\\x1b[31m\\u202e" in text and "qwen-7b falls back to b\\x07" in text
