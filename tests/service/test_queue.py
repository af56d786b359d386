"""Issue 11, sections 2, 3 and 6 over the client interface the CLI and TUI use, in process and through the socket:
a booking starts when asked or says why not; --asap joins a queue that moves up; admins move time and holders hear of it.
"""

from __future__ import annotations

import json
import subprocess
import time
from datetime import datetime, timedelta, timezone

import pytest

from app.errors import BadInput, Conflict, NotPermitted
from tests.service.support import BOARD, REPO
from tests.service.test_behaviour import ADMIN, HOUR, events_of, one_line_error, tomorrow


def test_a_count_starts_when_asked_or_says_the_earliest_start_that_works(client):
    start = tomorrow()
    whole = client.call("book", count=8, start=start, end=start + HOUR)
    with pytest.raises(Conflict) as refused:
        client.call("book", count=2, start=start, end=start + HOUR)
    message = str(refused.value)
    assert f"cards 0,1,2,3,4,5,6,7 are booked by {whole['user']} from" in message
    assert f"(booking {whole['id']}); the earliest start that works:" in message and "(--or-later takes it)" in message
    assert len(client.call("list")["bookings"]) == 1  # nothing slid in silently


def test_asap_takes_the_earliest_slot_and_joins_the_queue(client):
    start = tomorrow()
    client.call("book", count=8, start=start, end=start + HOUR)
    queued = client.call("book", count=2, start=start, end=start + HOUR, or_later=True)
    assert (queued["start"], queued["queued"], queued["requested_at"]) == (start + HOUR, "cards", start)
    assert "starts later than asked" in queued["notes"][0]


@pytest.mark.parametrize("cards", [None, [2, 3]], ids=["count", "cards"])
def test_or_later_at_a_free_time_is_not_queued(client, cli, cards):
    """It starts when asked: nothing earlier can free up for it, so it is not waiting (not `queued` in the list,
    not in board_bookings_queued)."""
    start = tomorrow()
    which = {"cards": cards} if cards else {"count": 2}
    taken = client.call("book", start=start, end=start + HOUR, or_later=True, **which)
    assert (taken["start"], taken["queued"], taken["requested_at"]) == (start, None, start)
    rc, out, err = cli("list")
    assert rc == 0 and f"#{taken['id']}" in out and "queued" not in out, out


def test_a_cancel_moves_the_queue_up_and_tells_the_holder(client):
    start = tomorrow()
    blocker = client.call("book", count=8, start=start, end=start + 2 * HOUR)
    queued = client.call("book", count=2, start=start, end=start + HOUR, or_later=True)
    fixed = client.call("book", count=2, start=start + 2 * HOUR, end=start + 3 * HOUR)  # did not ask to move
    assert queued["start"] == start + 2 * HOUR and fixed["start"] == start + 2 * HOUR
    client.call("cancel", id=blocker["id"])
    moved = client.call("get", id=queued["id"])
    assert (moved["start"], moved["end"]) == (start, start + HOUR)
    assert moved["notice"].startswith("moved up from ") and moved["notice"].endswith(" by backfill")
    assert client.call("get", id=fixed["id"])["start"] == start + 2 * HOUR
    backfill = [e for e in events_of(client, queued["id"]) if e["action"] == "backfill"]
    assert len(backfill) == 1 and backfill[0]["actor"] == "board"
    assert (backfill[0]["details"]["old_start"], backfill[0]["details"]["start"]) == (start + 2 * HOUR, start)


def _free_by(client, how: str, blocker: dict) -> None:
    if how == "release":
        client.call("release", id=blocker["id"])
    elif how == "move":
        client.call("move", id=blocker["id"], start=blocker["end"] + 5 * HOUR, end=blocker["end"] + 6 * HOUR)
    elif how == "reassign":
        client.call("reassign", id=blocker["id"], cards=[6])
    else:
        client.call("series_cancel", id=blocker["series_id"])


@pytest.mark.parametrize("how", ["release", "move", "reassign", "series_cancel"])
def test_every_change_that_frees_time_moves_the_queue_up(client, how):
    if how in ("move", "reassign") and not ADMIN:
        pytest.skip("only admins move and reassign bookings")
    if how == "release":  # only a booking that has started can be released
        start = int(time.time()) // 60 * 60
        blocker = client.call("book", cards=[5], start=start, end=start + 2 * HOUR)
    elif how == "series_cancel":  # tomorrow's 09:00-11:00 in the zone the service reads clock times in
        zone = timezone.utc if client.transport == "socket" else None
        first = (datetime.fromtimestamp(time.time(), zone).date() + timedelta(days=1)).isoformat()
        made = client.call("series_book", cards=[5], every="day", start="9:00", until="11:00", to=first,
                           **{"from": first})
        blocker = made["bookings"][0]
        start = blocker["start"]
    else:
        start = tomorrow()
        blocker = client.call("book", cards=[5], start=start, end=start + 2 * HOUR)
    queued = client.call("book", cards=[5], start=start, end=start + HOUR, or_later=True)
    assert queued["start"] == blocker["end"]
    _free_by(client, how, blocker)
    moved = client.call("get", id=queued["id"])
    assert moved["start"] < blocker["end"] and moved["notice"].endswith(" by backfill")


def test_the_queue_moves_in_class_order_then_by_when_asked(client):
    start = tomorrow()
    blocker = client.call("book", count=8, start=start, end=start + HOUR)
    experiment = client.call("book", count=8, start=start, end=start + HOUR, or_later=True)
    online = client.call("book", count=8, start=start, end=start + HOUR, or_later=True, **{"class": "online"})
    assert (experiment["start"], online["start"]) == (start + HOUR, start + 2 * HOUR)
    client.call("cancel", id=blocker["id"])
    # The hour that freed goes to online, though experiment asked first; experiment never moves later.
    assert client.call("get", id=online["id"])["start"] == start
    assert client.call("get", id=experiment["id"])["start"] == start + HOUR


def test_class_order_comes_before_request_order_when_they_disagree(client):
    """Experiment asked first, for an earlier start; online asked later, for a later one. The freed time fits one
    of them: it goes to online. Taken by when asked (or by id), experiment would move up instead."""
    start = tomorrow()
    blocker = client.call("book", count=8, start=start, end=start + 2 * HOUR)
    experiment = client.call("book", count=8, start=start, end=start + 2 * HOUR, or_later=True)
    online = client.call("book", count=8, start=start + HOUR // 2, end=start + 2 * HOUR, or_later=True,
                         **{"class": "online"})
    assert (experiment["requested_at"], online["requested_at"]) == (start, start + HOUR // 2)
    assert (experiment["start"], online["start"]) == (start + 2 * HOUR, start + 4 * HOUR)
    client.call("cancel", id=blocker["id"])
    assert client.call("get", id=online["id"])["start"] == start + HOUR // 2
    assert client.call("get", id=experiment["id"])["start"] == start + 2 * HOUR  # no room before online: it stays


def test_in_one_class_the_earlier_asked_start_comes_first_whatever_the_order_made(client):
    """Two experiments: the one made second asked for the earlier start, and the freed time fits only one of them.
    It goes to the earlier asked start; taken in the order made (by id), the other would move up instead."""
    start = tomorrow()
    blocker = client.call("book", count=8, start=start, end=start + 2 * HOUR)
    later = client.call("book", count=8, start=start + HOUR // 2, end=start + 2 * HOUR, or_later=True)
    earlier = client.call("book", count=8, start=start, end=start + 2 * HOUR, or_later=True)
    assert (later["start"], earlier["start"]) == (start + 2 * HOUR, start + 7 * HOUR // 2)
    client.call("cancel", id=blocker["id"])
    assert client.call("get", id=earlier["id"])["start"] == start
    assert client.call("get", id=later["id"])["start"] == start + 2 * HOUR


def test_a_queued_booking_on_named_cards_keeps_them(client):
    start = tomorrow()
    blocker = client.call("book", cards=[2, 3], start=start, end=start + 2 * HOUR)
    queued = client.call("book", cards=[3], start=start, end=start + HOUR, or_later=True)
    assert (queued["start"], queued["queued"]) == (start + 2 * HOUR, "time")
    client.call("cancel", id=blocker["id"])
    moved = client.call("get", id=queued["id"])
    assert (moved["cards"], moved["start"]) == ([3], start)


def test_an_end_before_the_start_is_refused_with_both_times(cli):
    rc, _, err = cli("book", "1", "--start", "tomorrow 14:00", "--until", "tomorrow 13:00")
    assert rc == 2 and "14:00" in one_line_error(err) and "13:00" in err


def test_the_cli_books_asap_lists_it_queued_and_its_requested_at(cli, client):
    start = tomorrow()
    client.call("book", count=8, start=start, end=start + HOUR)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(start))
    rc, out, err = cli("book", "2", "--start", when, "--for", "1h", "--asap")
    assert rc == 0, err
    assert "queued: booking" in err and "board wait" in err
    rc, out, _ = cli("list", "--json")
    mine = [b for b in json.loads(out)["bookings"] if b["queued"]]
    assert len(mine) == 1 and mine[0]["queued"] == "cards"
    assert mine[0]["requested_at"].startswith(time.strftime("%Y-%m-%dT%H:%M", time.localtime(start)))
    rc, out, _ = cli("list")
    assert "queued" in out


def test_the_cli_refuses_a_count_that_cannot_start_when_asked_with_exit_3(cli, client):
    start = tomorrow()
    client.call("book", count=8, start=start, end=start + HOUR)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(start))
    rc, _, err = cli("book", "2", "--start", when, "--for", "1h")
    assert rc == 3 and "the earliest start that works" in one_line_error(err)
    rc, _, err = cli("book", "2", "--start", when, "--for", "1h", "--or-later")
    assert rc == 0, err


# -- waiting --------------------------------------------------------------------------------------


def test_wait_blocks_until_the_start_then_prints_the_cards(target, client):
    """It is seen waiting before the start comes: the start is moved near only then (an admin's move, which the wait
    polls for), so a slow start of the command on a loaded machine cannot find the booking begun already."""
    later = int(time.time()) + HOUR
    booking = client.call("book", cards=[5, 6], start=later, end=later + HOUR)
    waiting = subprocess.Popen([str(BOARD), "wait", str(booking["id"]), "--timeout", "1m"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=target.env, cwd=REPO)
    try:
        first = waiting.stderr.readline()
        assert first.startswith(f"board: waiting for booking {booking['id']}: starts ") and "min) on cards 5,6" in first
        assert waiting.poll() is None
        soon = int(time.time()) + 2
        client.call("move", id=booking["id"], start=soon, end=soon + HOUR)
        out, err = waiting.communicate(timeout=60)
    finally:
        waiting.kill()
    assert waiting.returncode == 0, err
    assert out == "5,6\n" and time.time() >= soon
    # The moved start is said again only where a poll came before it.
    assert all(line.startswith(f"board: waiting for booking {booking['id']}: starts ") for line in err.splitlines())


def test_wait_on_a_cancelled_booking_exits_3(cli, client):
    start = tomorrow()
    booking = client.call("book", cards=[1], start=start, end=start + HOUR)
    client.call("cancel", id=booking["id"])
    rc, out, err = cli("wait", str(booking["id"]))
    assert rc == 3 and out == "" and "was cancelled" in one_line_error(err)


def test_wait_sees_a_cancel_while_it_waits_and_gives_up_after_the_timeout(client):
    import io

    from app.client.wait import POLL_S, wait_for_start

    start = tomorrow()
    booking = client.call("book", cards=[1], start=start, end=start + HOUR)
    clock = [time.time()]
    progress = io.StringIO()

    def sleep(seconds: float) -> None:  # the waiter's own time passes; the service's is real
        clock[0] += seconds
        if clock[0] - sleep.began > POLL_S and not sleep.moved:  # cancelled while it waits: seen at the next poll
            sleep.moved = True
            client.call("cancel", id=booking["id"])

    sleep.began, sleep.moved = clock[0], False
    with pytest.raises(Conflict, match=f"booking {booking['id']} was cancelled"):
        wait_for_start(client, booking["id"], timeout=3600, clock=lambda: clock[0], sleep=sleep, progress=progress)
    assert progress.getvalue().count("waiting for booking") == 1

    later = client.call("book", cards=[1], start=start, end=start + HOUR)
    clock[0] = time.time()
    with pytest.raises(Conflict, match=f"booking {later['id']} has not started: it starts"):
        wait_for_start(client, later["id"], timeout=60, clock=lambda: clock[0],
                       sleep=lambda s: clock.__setitem__(0, clock[0] + s), progress=progress)


def test_get_list_and_wait_say_a_queued_bookings_place_and_why(client, cli):
    """A waiting booking's `get` and `list` have its place in its class's queue and why; `board wait` and `board
    list` print it; a booking not waiting has none. Without [[projects]] every booking stands equal: first come
    (app.core.fairshare). Wrong versions: the place counted across classes (3rd), the online one that goes first
    left unsaid, a place on a booking that waits for nothing (not queued, or queued at the start it asked for)."""
    import io

    from app.client.wait import wait_for_start

    start = tomorrow()
    blocker = client.call("book", count=8, start=start, end=start + HOUR)
    client.call("book", count=8, start=start, end=start + HOUR, or_later=True)
    second = client.call("book", count=8, start=start, end=start + HOUR, or_later=True)
    online = client.call("book", count=8, start=start, end=start + HOUR, or_later=True, **{"class": "online"})
    said = "2nd of 2 in the experiment queue: first come; 1 waiting online booking goes first"
    assert client.call("get", id=second["id"])["place"] == said
    assert "place" not in client.call("get", id=blocker["id"])
    listed = {b["id"]: b.get("place") for b in client.call("list")["bookings"]}
    assert listed[second["id"]] == said and listed[blocker["id"]] is None
    rc, out, err = cli("list")
    line = next(line for line in out.splitlines() if line.startswith(f"#{second['id']} "))
    assert rc == 0 and line.endswith(f"  experiment  queued ({said})"), line
    clock = [time.time()]
    progress = io.StringIO()
    with pytest.raises(Conflict, match=f"booking {second['id']} has not started"):
        wait_for_start(client, second["id"], timeout=60, clock=lambda: clock[0],
                       sleep=lambda s: clock.__setitem__(0, clock[0] + s), progress=progress)
    assert progress.getvalue().count(f"; {said}\n") == 1
    client.call("cancel", id=blocker["id"])  # online moves up to the start it asked for: it waits for nothing now
    assert client.call("get", id=online["id"])["start"] == start and "place" not in client.call("get", id=online["id"])
    assert client.call("get", id=second["id"])["place"] == "2nd of 2 in the experiment queue: first come"


TWO_PROJECTS = """
[[projects]]
name = "A"
members = ["root"]
share = 2

[[projects]]
name = "B"
members = ["root"]
"""


def test_the_real_agent_moves_the_project_under_its_share_up_first_and_says_why(make_agent):
    """The issue's case on the real service and socket: project A used 96 card-hours a day ago (written into the
    store), B nothing; A's booking asked for the earlier start, B's half an hour later, each an hour of the whole
    fleet, queued behind a two-hour blocker. When it is cancelled, B's goes first (at its asked start), A's after
    it, and `board wait`'s `get` said so beforehand: A's 96 card-hours from 24 to 12 hours ago are
    8 * 168 / ln 2 * (2 ** (-0.5/7) - 2 ** (-1/7)) = 89.1 h now, against share 2. Wrong versions: first come
    before fair share (A first), the use not decayed (96.0 h), the share ignored."""
    import sqlite3

    from app.store import bookings

    agent = make_agent(start=False)
    agent.config.write_text(agent.config.read_text() + TWO_PROJECTS)
    agent.start()
    client = agent.client()
    uuids = [card["uuid"] for card in client.call("status")["cards"]]  # the service has made the file and its cards
    now = int(time.time())
    with sqlite3.connect(agent.db, timeout=10) as raw:
        bookings.insert(raw, user="root", uid=0, uuids=uuids, start=now - 24 * HOUR, end=now - 12 * HOUR,
                        klass="batch", note="", request=None, now=now - 24 * HOUR, created_by=0, project="A")
    start = tomorrow()
    half = HOUR // 2
    blocker = client.call("book", count=8, start=start, end=start + 2 * HOUR, project="B")
    a = client.call("book", count=8, start=start, end=start + HOUR, or_later=True, project="A", **{"class": "batch"})
    b = client.call("book", count=8, start=start + half, end=start + half + HOUR, or_later=True, project="B",
                    **{"class": "batch"})
    assert (a["start"], b["start"]) == (start + 2 * HOUR, start + 3 * HOUR)  # first come, when they were booked
    assert client.call("get", id=b["id"])["place"] == (
        "1st of 2 in the batch queue: project B (used 0.0 h against share 1, decayed) goes before project A"
        " (89.1 h against share 2); then first come")
    assert client.call("get", id=a["id"])["place"].startswith("2nd of 2 in the batch queue: project B ")
    client.call("cancel", id=blocker["id"])
    # First come (A's earlier asked start) before fair share would give A the start and B the hour after it.
    assert [client.call("get", id=x["id"])["start"] for x in (b, a)] == [start + half, start + half + HOUR]
    client.close()


def test_run_wait_starts_the_command_when_the_booking_starts(cli, client):
    soon = int(time.time()) + 3
    booking = client.call("book", cards=[7], start=soon, end=soon + HOUR)
    rc, out, err = cli("run", "--booking", str(booking["id"]), "--wait", "--", "sh", "-c",
                       'echo "$BOARD_BOOKING_ID $BOARD_BOOKING_END"; date +%s')
    assert rc == 0, err
    booking_id, end, started = out.split()
    assert int(booking_id) == booking["id"] and end and int(started) >= soon


@pytest.mark.skipif(not ADMIN, reason="needs an admin caller (root, or a member of board-admin)")
def test_run_wait_on_someone_elses_booking_is_refused_at_once(cli, client):
    """As without --wait: exit 4 now, audited, rather than after waiting for a start that is not ours."""
    start = tomorrow()
    booking = client.call("book", cards=[6], start=start, end=start + HOUR)
    client.call("reassign", id=booking["id"], user="nobody")
    rc, out, err = cli("run", "--booking", str(booking["id"]), "--wait", "--", "true", timeout=30)
    assert (rc, out) == (4, "")
    assert one_line_error(err) == f"board: booking {booking['id']} belongs to nobody; run on your own booking"
    refused = [e for e in events_of(client, booking["id"]) if e["action"] == "run"]
    assert [e["ok"] for e in refused] == [False]


def test_run_wait_needs_the_booking(cli):
    rc, _, err = cli("run", "--wait", "--", "true")
    assert rc == 2 and "--booking ID" in one_line_error(err)


# -- admins move time, holders hear of it ---------------------------------------------------------


@pytest.mark.skipif(not ADMIN, reason="needs an admin caller (root, or a member of board-admin)")
def test_an_admin_move_changes_the_times_keeps_the_cards_and_is_audited(client):
    start = tomorrow()
    booking = client.call("book", cards=[4, 5], start=start, end=start + HOUR)
    moved = client.call("move", id=booking["id"], start=start + 3 * HOUR, end=start + 5 * HOUR)
    assert (moved["cards"], moved["start"], moved["end"]) == ([4, 5], start + 3 * HOUR, start + 5 * HOUR)
    event = events_of(client, booking["id"])[0]
    assert (event["action"], event["ok"], event["details"]["old_start"]) == ("move", True, start)
    with pytest.raises(Conflict):
        other = client.call("book", cards=[5], start=start + 6 * HOUR, end=start + 7 * HOUR)
        client.call("move", id=other["id"], start=start + 4 * HOUR, end=start + 5 * HOUR)


def test_move_bad_times_write_nothing_and_a_member_may_not_move(client):
    start = tomorrow()
    booking = client.call("book", cards=[4], start=start, end=start + HOUR)
    before = len(events_of(client))
    with pytest.raises(BadInput if ADMIN else NotPermitted) as refused:
        client.call("move", id=booking["id"], start=start + 2 * HOUR, end=start + HOUR)
    if ADMIN:
        assert "must be after the start" in str(refused.value) and len(events_of(client)) == before
    else:  # a member's attempt is refused by rule, and audited
        assert "only admins" in str(refused.value) and len(events_of(client)) == before + 1
    assert client.call("get", id=booking["id"])["start"] == start
