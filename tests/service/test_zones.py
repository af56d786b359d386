"""Times read in the member's own zone (issue 17, B1), in process and through the real agent.

The agent runs as the unit runs it, with TZ=UTC (tests/agent_process.py); this process and the CLI run
with TZ=Asia/Shanghai, eight hours ahead. Every time the service words (a refusal, the earliest start, a
`book` note, a stored notice, a live notice) must read in Shanghai time, as `board list` already does;
the policy window stays in [policy] timezone (Europe/Berlin here) and says so.
"""

from __future__ import annotations

import json
import queue
import re
import threading
import time
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from app.core.text import format_day, format_time
from app.errors import BadInput, Conflict
from tests.service.support import BOARD, REPO
from tests.service.test_behaviour import ADMIN, HOUR, ME, one_line_error

SHANGHAI = ZoneInfo("Asia/Shanghai")
BERLIN = ZoneInfo("Europe/Berlin")
POOLS = """
[policy]
timezone = "Europe/Berlin"
max_ahead_days = 14

[[pools]]
name = "prod"
cards = [0, 1, 2, 3]
classes = ["online", "batch", "finetune"]
[pools.windows]
finetune = { hours = "19:00-07:00", weekends = false }

[[pools]]
name = "lab"
cards = [4, 5, 6, 7]

[llama]
server_bin = "/bin/true"
"""


@pytest.fixture(autouse=True)
def in_shanghai(set_tz):
    """This process (the member's client, and over the local transport the service too) reads Shanghai time."""
    set_tz("Asia/Shanghai")


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


# -- every message that carries a time, one table ------------------------------------------------------------------
#
# Each case makes the service (or the member's own client) word a message with times in it, and names the pieces
# that must read in Shanghai time. The agent words in UTC and the policy in Berlin: a piece worded in either zone, or
# a stamp the client left as it came (`<@when:...>`, an epoch, an ISO time), fails.

UTC_MARKS = re.compile(r"<@|\d{9,}|\d{4}-\d\d-\d\dT\d|[+-]00:00|\bUTC\b|\bZ\b")


def berlin(days: int, hour: int) -> int:
    """`hour`:00 in the policy's zone `days` days from today there (a series' times of day are read there)."""
    day = datetime.now(BERLIN).date() + timedelta(days=days)
    return int(datetime(day.year, day.month, day.day, hour, tzinfo=BERLIN).timestamp())


def berlin_day(days: int) -> str:
    return (datetime.now(BERLIN).date() + timedelta(days=days)).isoformat()


def day_shown(epoch: int) -> str:
    """How the member's board words an occurrence: its weekday and date, in their zone."""
    return format_day(epoch)


def _refused(cli, *args: str, rc: int) -> str:
    code, _, err = cli(*args)
    assert code == rc, err
    return one_line_error(err)


def _started_booking_in_the_way(client, cli):
    """A conflict with a booking that has started: 'until' its end, and the next free start, both 'when's."""
    end = shanghai(1, 10)
    held = client.call("book", cards=[5], start=int(time.time()), end=end)
    said = _refused(cli, "book", "--cards", "5", "--start", "now", "--for", "1h", rc=3)
    return said, [f"card 5 is booked by {ME} until {shown(end)} (in ", f"(booking {held['id']})",
                  f"next free start for cards 5: {shown(end)} (in "]


def _no_card_free_for_a_count(client, cli):
    """A count that finds no free card: the start asked for, who holds the cards from when to when, and the earliest
    start on any card (the second half a count's refusal gets)."""
    start = shanghai(2, 10)
    held = client.call("book", cards=[4, 5, 6, 7], start=start, end=start + 2 * HOUR)
    said = _refused(cli, "book", "1", "--start", iso(start), "--for", "1h", rc=3)
    return said, [f"no card is free for an experiment booking at {shown(start)} (in ",
                  f"cards 4,5,6,7 are booked by {ME} from {shown(start)} (in ",
                  f" to {shown(start + 2 * HOUR)} (booking {held['id']})",
                  f"the earliest start that works: {shown(start + 2 * HOUR)} (in "]


def _the_rules_allow_too_few_cards(client, cli):
    """A count the pools' rules refuse: the start asked for, the window in the policy's zone (labelled), and the
    earliest start where the window opens, in the member's."""
    start = shanghai(2, 20)  # 13:00 in Berlin: prod's finetune window (19:00-07:00 there) is shut
    day = datetime.fromtimestamp(start, BERLIN).date()
    opens = int(datetime(day.year, day.month, day.day, 19, tzinfo=BERLIN).timestamp())
    said = _refused(cli, "book", "8", "--class", "finetune", "--start", iso(start), "--for", "1h", rc=4)
    return said, [f"8 cards for a 1h finetune booking from {shown(start)} (in ",
                  "only 19:00-07:00 (Europe/Berlin)", f"the earliest start that works: {shown(opens)} (in "]


def _a_start_in_the_past(client, cli):
    past = int(time.time()) - 2 * HOUR
    with pytest.raises(BadInput) as refused:
        client.call("book", cards=[6], start=past, end=past + 4 * HOUR)
    return str(refused.value), [f"the start {shown(past)} is in the past; pick a start from now on"]


def _an_extension_that_ends_earlier(client, cli):
    end = shanghai(1, 10)
    booking = client.call("book", cards=[6], start=int(time.time()), end=end)
    with pytest.raises(BadInput) as refused:
        client.call("extend", id=booking["id"], end=end - HOUR)
    return str(refused.value), [f"the new end must be after the current end {shown(end)} (in "]


def _a_series_the_policy_refuses(client, cli):
    """Only occurrence days in it (no 'when'): the client words those too."""
    first, last = berlin(1, 9), berlin(3, 9)  # 16:00 in Shanghai in winter, 15:00 in summer
    said = _refused(cli, "book", "--cards", "0", "--class", "finetune", "--every", "day", "--start", "9:00",
                    "--until", "10:00", "--from", berlin_day(1), "--to", berlin_day(3), rc=4)
    return said, ["the policy refuses 3 of 3 occurrences, so nothing was booked: card 0: class finetune is allowed on"
                  f" pool prod only 19:00-07:00 (Europe/Berlin) (3 occurrences, {day_shown(first)} to {day_shown(last)})"]


def _a_series_the_policy_refuses_and_a_booking_is_in_the_way_of(client, cli):
    """Occurrences past max_ahead_days (14) refused, listed by day; the conflict an earlier one meets listed by its
    day, and its holder from when to when."""
    taken = berlin(12, 9)
    held = client.call("book", cards=[1], start=taken, end=taken + HOUR, **{"class": "online"})
    said = _refused(cli, "book", "--cards", "1", "--class", "online", "--every", "day", "--start", "9:00",
                    "--until", "10:00", "--from", berlin_day(12), "--to", berlin_day(16), rc=4)
    return said, ["a booking may start at most 14 days ahead (", f" to {day_shown(berlin(16, 9))})",
                  f"; also 1 conflict: {day_shown(taken)}: card 1 is booked by {ME} from {shown(taken)} (in ",
                  f" to {shown(taken + HOUR)} (booking {held['id']})"]


def _a_series_a_booking_is_in_the_way_of(client, cli):
    taken = berlin(2, 9)
    held = client.call("book", cards=[1], start=taken, end=taken + HOUR, **{"class": "online"})
    said = _refused(cli, "book", "--cards", "1", "--class", "online", "--every", "day", "--start", "9:00",
                    "--until", "10:00", "--from", berlin_day(1), "--to", berlin_day(3), rc=3)
    return said, [f"{day_shown(taken)}: card 1 is booked by {ME} from {shown(taken)} (in ",
                  f" to {shown(taken + HOUR)} (booking {held['id']})"]


def _waiting_for_a_booking_that_has_not_started(client, cli):
    """`board wait` words the start itself, in the member's process."""
    from app.client.wait import wait_for_start

    start = shanghai(2, 9)
    booking = client.call("book", cards=[7], start=start, end=start + HOUR)
    with pytest.raises(Conflict) as refused:
        wait_for_start(client, booking["id"], timeout=0)
    return str(refused.value), [f"booking {booking['id']} has not started: it starts {shown(start)} (in "]



def _an_admins_extension_noted_for_the_holder(client, cli):
    """The notice an admin's change leaves on someone else's booking (it is worded when its holder reads it)."""
    if not ADMIN:
        pytest.skip("needs an admin caller (root, or a member of board-admin)")
    start = shanghai(2, 9)
    booking = client.call("book", cards=[4], start=start, end=start + HOUR)
    client.call("reassign", id=booking["id"], user="nobody")
    client.call("extend", id=booking["id"], end=start + 3 * HOUR)
    return client.call("get", id=booking["id"])["notice"], [f"extended to {shown(start + 3 * HOUR)} by admin {ME}"]


def _a_server_on_a_booking_that_has_not_started(client, cli):
    """`serve start` before the booking starts: the service says when it does (the config names an executable as
    llama-server, so the refusal is the booking's)."""
    start = shanghai(2, 9)
    booking = client.call("book", cards=[5], start=start, end=start + HOUR)
    said = _refused(cli, "serve", "start", str(booking["id"]), rc=4)
    return said, [f"booking {booking['id']} is not active now (starts {shown(start)}, in "]

MESSAGES = [_started_booking_in_the_way, _no_card_free_for_a_count, _the_rules_allow_too_few_cards,
            _a_start_in_the_past, _an_extension_that_ends_earlier, _a_series_the_policy_refuses,
            _a_series_the_policy_refuses_and_a_booking_is_in_the_way_of, _a_series_a_booking_is_in_the_way_of,
            _waiting_for_a_booking_that_has_not_started, _an_admins_extension_noted_for_the_holder,
            _a_server_on_a_booking_that_has_not_started]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda case: case.__name__.strip("_"))
def test_every_message_with_a_time_reads_in_the_members_zone(zoned, message):
    """Wrong versions: a time worded by the service (in UTC, the agent's zone) or in the policy's zone; a stamp left
    raw (a client whose fast path looks for one kind of stamp only); a 'when' worded as a bare time or the reverse."""
    client, cli = zoned
    said, pieces = message(client, cli)
    for piece in pieces:
        assert piece in said, f"{piece!r} not in {said!r}"
    assert not UTC_MARKS.search(said), said



def test_a_keys_expiry_reads_in_the_members_zone(zoned):
    """`board key new --expires` and `board key list` say when the key stops working in the member's zone (+08:00),
    from the epoch the service keeps. Wrong version: the expiry worded in UTC (+00:00) or by the service."""
    client, cli = zoned
    rc, out, err = cli("key", "new", "--expires", "2d")
    assert rc == 0, err
    (key,) = [k for k in client.call("key_list") if k["id"] == int(out.splitlines()[1].split()[1])]
    expires = datetime.fromtimestamp(key["expires"], SHANGHAI).isoformat(timespec="seconds")
    assert expires.endswith("+08:00") and f" expires: {expires}. " in out.splitlines()[1]
    rc, out, err = cli("key", "list")
    assert rc == 0 and expires in out and "+00:00" not in out, out + err

_SILENT_HOST = """
import sys
from dataclasses import replace
from pathlib import Path

from app.client.local import LocalClient
from app.config import Config, FleetSettings
from app.core.identity import Identity
from app.gpu import open_source
from app.service.fleet.hosts import beat

seen = float(sys.argv[2])
config = Config(db_path=Path(sys.argv[1]), fleet=FleetSettings(host="gpu2"))
gpu2 = LocalClient.on(config, open_source(True, clock=lambda: seen, host="gpu2"), Identity("board", 0, False),
                      clock=lambda: seen)
beat(gpu2.service)
gpu2.service.close()
"""


@pytest.mark.real_users
def test_a_host_down_note_and_refusal_read_in_the_members_zone(make_agent, tmp_path):
    """The agent (TZ=UTC) words when it last heard from gpu2 for a member in Shanghai. Wrong version: the service
    words the time itself (format_time in its own zone, UTC) instead of stamping it."""
    import subprocess
    import sys

    from tests.service.support import SERVICE_USER, run_as

    agent = make_agent(sections={"fleet": {"host": "gpu1", "heartbeat_timeout_s": 5}})
    seen = int(time.time()) - HOUR  # gpu2's service last beat an hour ago, as its own service writes a beat
    beaten = run_as(SERVICE_USER, sys.executable, "-c", _SILENT_HOST, str(agent.db), str(seen),
                    env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "TZ": "UTC", "PYTHONPATH": str(REPO)})
    assert beaten.returncode == 0, beaten.stderr
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TZ": "Asia/Shanghai", "HOME": str(tmp_path),
           "BOARD_CONFIG": str(agent.config), "PYTHONDONTWRITEBYTECODE": "1"}

    def cli(*args: str) -> tuple[int, str, str]:
        done = subprocess.run([str(BOARD), *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
        return done.returncode, done.stdout, done.stderr

    silent = f"host gpu2 is down (no word from its service since {shown(seen)})"
    said = _refused(cli, "book", "--cards", "gpu2:0", "--start", "now", "--for", "1h", rc=3)
    assert said.startswith(f"board: {silent}: nobody can see what runs on its cards now;"), said
    start = shanghai(2, 9)
    rc, _, err = cli("book", "--cards", "gpu2:0", "--start", iso(start), "--for", "1h", "--json")
    assert rc == 0, err
    assert err.splitlines() == [f"board: note: {silent}: booked anyway; nobody can see what runs on its cards until"
                                " it is back"]
    assert not UTC_MARKS.search(said + err)


@pytest.mark.real_users
def test_the_started_notice_reads_in_the_members_zone(make_agent):
    """The agent's pass tells a holder their booking has started, and until when: in the holder's zone. Wrong
    version: the end worded by the agent (UTC)."""
    # Passes every 0.2 s: the first (which announces nothing: what started before it is old news) is long over
    # when the booking starts, 5 s on.
    agent = make_agent(sections={"enforce": {"interval_s": 0.2}})
    client = agent.client()
    events = _subscribed(client)
    end = shanghai(1, 10)
    booking = client.call("book", cards=[4], start=int(time.time()) + 5, end=end)
    notice = _next_notice(events)
    assert notice == f"booking {booking['id']} has started: cards 4 until {shown(end)}"
    assert not UTC_MARKS.search(notice)
    client.close()
