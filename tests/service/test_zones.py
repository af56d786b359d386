"""Times read in the member's own zone (issue 17, B1), in process and through the real agent.

The agent runs as the unit runs it, with TZ=UTC (tests/agent_process.py); this process and the CLI run
with TZ=Asia/Shanghai, eight hours ahead. Every time the service words (a refusal, the earliest start, a
`book` note, a stored notice, a live notice) must read in Shanghai time, as `board list` already does;
the policy window stays in [policy] timezone (Europe/Berlin here) and says so.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from app.core.text import format_time
from tests.service.support import BOARD, REPO
from tests.service.test_behaviour import ADMIN, HOUR, ME, one_line_error

SHANGHAI = ZoneInfo("Asia/Shanghai")
BERLIN = ZoneInfo("Europe/Berlin")
POOLS = """
[policy]
timezone = "Europe/Berlin"

[[pools]]
name = "prod"
cards = [0, 1, 2, 3]
classes = ["online", "batch", "finetune"]
[pools.windows]
finetune = { hours = "19:00-07:00", weekends = false }

[[pools]]
name = "lab"
cards = [4, 5, 6, 7]
"""


@pytest.fixture(autouse=True)
def in_shanghai(monkeypatch):
    """This process (the member's client, and over the local transport the service too) reads Shanghai time."""
    monkeypatch.setenv("TZ", "Asia/Shanghai")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture(params=["local", pytest.param("socket", marks=pytest.mark.real_users)])
def zoned(request, tmp_path):
    """(client, cli) for one transport, with POOLS; the agent (socket) keeps the unit's TZ=UTC."""
    import subprocess

    base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TZ": "Asia/Shanghai", "HOME": str(tmp_path),
            "XDG_STATE_HOME": str(tmp_path / "state"), "PYTHONDONTWRITEBYTECODE": "1"}
    if request.param == "socket":
        agent = request.getfixturevalue("make_agent")(start=False)
        with open(agent.config, "a") as config:
            config.write(POOLS)
        agent.start()
        client, env = agent.client(), {**base, "BOARD_CONFIG": str(agent.config)}
    else:
        from app.client.local import LocalClient
        from app.config import load_config

        config = tmp_path / "board.toml"
        config.write_text(f'[storage]\ndb = "{tmp_path / "board.db"}"\n' + POOLS)
        client = LocalClient.open(load_config(environ={"BOARD_CONFIG": str(config)}), demo=None,
                                  environ={"BOARD_SIMULATE": "1"})
        env = {**base, "BOARD_CONFIG": str(config), "BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": "1"}

    def cli(*args: str) -> tuple[int, str, str]:
        done = subprocess.run([str(BOARD), *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
        return done.returncode, done.stdout, done.stderr

    yield client, cli
    client.close()


def shanghai(days: int, hour: int) -> int:
    """`hour`:00 Shanghai time `days` days from today there: an instant whose UTC hour differs by eight."""
    day = datetime.now(SHANGHAI).date() + timedelta(days=days)
    return int(datetime(day.year, day.month, day.day, hour, tzinfo=SHANGHAI).timestamp())


def iso(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, SHANGHAI).strftime("%Y-%m-%dT%H:%M")


def shown(epoch: int) -> str:
    """How the member's board words `epoch`: their zone (format_time reads this process's TZ)."""
    return format_time(epoch, time.time())


def test_a_conflict_and_its_earliest_start_read_in_the_members_zone(zoned):
    client, cli = zoned
    start = shanghai(2, 10)  # 02:00 UTC
    held = client.call("book", cards=[5], start=start, end=start + 2 * HOUR)
    rc, _, err = cli("book", "--cards", "5", "--start", iso(start), "--for", "1h")
    assert rc == 3
    said = one_line_error(err)
    assert shown(start + 2 * HOUR).endswith("12:00")  # the helper is in Shanghai time: 04:00 in UTC
    assert shown(start).endswith("10:00")
    assert f"card 5 is booked by {ME} from {shown(start)} (in " in said
    assert f" to {shown(start + 2 * HOUR)} (booking {held['id']}); next free start for cards 5:" \
           f" {shown(start + 2 * HOUR)} (in " in said
    assert "<@" not in said and "04:00" not in said


def test_a_policy_refusal_labels_the_window_and_words_the_next_start_in_the_members_zone(zoned):
    client, cli = zoned
    start = shanghai(2, 20)  # 13:00 or 14:00 in Berlin: outside 19:00-07:00 there
    day = datetime.fromtimestamp(start, BERLIN).date()
    opens = int(datetime(day.year, day.month, day.day, 19, tzinfo=BERLIN).timestamp())  # 01:00 or 02:00 in Shanghai
    rc, _, err = cli("book", "--cards", "0", "--class", "finetune", "--start", iso(start), "--for", "1h")
    assert rc == 4
    assert one_line_error(err).startswith(
        "board: card 0: class finetune is allowed on pool prod only 19:00-07:00 (Europe/Berlin);"
        f" next free start for cards 0: {shown(opens)} (in ")
    assert shown(opens)[-5:] in ("01:00", "02:00")


def test_a_book_note_and_the_backfills_notices_read_in_the_members_zone(zoned):
    client, cli = zoned
    start = shanghai(2, 9)
    blocker = client.call("book", cards=[6], start=start, end=start + 2 * HOUR)
    rc, out, err = cli("book", "--cards", "6", "--start", iso(start), "--for", "1h", "--or-later", "--json")
    assert rc == 0, err
    notes = [line for line in err.splitlines() if line.startswith("board: note: ")]
    assert len(notes) == 1 and notes[0].startswith(
        f"board: note: starts later than asked: card 6 is booked by {ME} from {shown(start)} (in ")
    assert f" to {shown(start + 2 * HOUR)} (booking {blocker['id']})" in notes[0]
    assert shown(start + 2 * HOUR).endswith("11:00")  # 03:00 in UTC
    queued = json.loads(out)

    events = _subscribed(client)
    client.call("cancel", id=blocker["id"])  # the queued booking moves up to 09:00, and its holder is told
    notice = _next_notice(events)
    assert notice.startswith(f"booking {queued['id']} was moved up from {shown(start + 2 * HOUR)} by backfill: now"
                             f" {shown(start)} (in ")
    assert client.call("get", id=queued["id"])["notice"] == f"moved up from {shown(start + 2 * HOUR)} by backfill"
    rc, out, _ = cli("list", "--mine")
    assert rc == 0 and f"(moved up from {shown(start + 2 * HOUR)} by backfill)" in out


@pytest.mark.skipif(not ADMIN, reason="needs an admin caller (root, or a member of board-admin)")
def test_an_admins_move_is_noted_in_the_holders_zone(zoned):
    client, _ = zoned
    start = shanghai(2, 9)
    booking = client.call("book", cards=[7], start=start, end=start + HOUR)
    client.call("reassign", id=booking["id"], user="nobody")  # someone else's booking: the move is noted for them
    client.call("move", id=booking["id"], start=start + 3 * HOUR, end=start + 4 * HOUR)
    assert client.call("get", id=booking["id"])["notice"] == (
        f"moved from {shown(start)}-{shown(start + HOUR)} to {shown(start + 3 * HOUR)}-{shown(start + 4 * HOUR)}"
        f" by admin {ME}")


def _subscribed(client) -> queue.Queue:
    """Events for this member on a thread of their own, once the subscription is live (its first fleet event)."""
    found: queue.Queue = queue.Queue()
    live = threading.Event()

    def follow() -> None:
        for event in client.subscribe(("fleet", "notice")):
            if event.get("event") == "fleet":
                live.set()
            else:
                found.put(event)

    threading.Thread(target=follow, daemon=True).start()
    assert live.wait(30), "no fleet event within 30 s"
    return found


def _next_notice(events: queue.Queue) -> str:
    event = events.get(timeout=30)
    assert event["event"] == "notice", event
    return event["message"]


def test_stamps_stay_out_of_the_wire_reply_for_a_member(zoned):
    """What the client hands on has no stamp left in it, whatever it holds (notes, notices, refusals)."""
    client, _ = zoned
    start = shanghai(2, 9)
    client.call("book", cards=[4], start=start, end=start + HOUR)
    made = client.call("book", cards=[4], start=start, end=start + HOUR, or_later=True)
    assert made["notes"] and not any("<@" in note for note in made["notes"])
    assert "<@" not in str(client.call("log", limit=10))



async def test_the_boards_toast_reads_in_the_members_zone(make_agent):
    """The board (TUI) on the agent's socket toasts a live notice in the member's zone."""
    from app.config import load_config
    from app.core.identity import Identity
    from app.tui.app import BoardApp

    agent = make_agent()
    client = agent.client()
    me = client.call("whoami")
    app = BoardApp(agent.client(), identity=Identity(me["user"], me["uid"], me["admin"]),
                   config=load_config(environ={"BOARD_CONFIG": str(agent.config)}), host="gpu-box")
    start = shanghai(2, 9)
    async with app.run_test(size=(120, 40)) as pilot:
        await _until(pilot, lambda: app.fleet is not None)  # its subscription is live
        blocker = client.call("book", cards=[6], start=start, end=start + 2 * HOUR)
        queued = client.call("book", cards=[6], start=start, end=start + HOUR, or_later=True)
        client.call("cancel", id=blocker["id"])  # the backfill moves the queued booking up and tells its holder

        def toasts() -> list[str]:
            return [n.message for n in app._notifications if n.message.startswith(f"booking {queued['id']} was moved")]

        await _until(pilot, toasts)
        assert toasts()[0].startswith(f"booking {queued['id']} was moved up from {shown(start + 2 * HOUR)} by backfill:"
                                      f" now {shown(start)} (in ")
    client.close()


async def _until(pilot, condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {condition}"
        await pilot.pause(0.05)
