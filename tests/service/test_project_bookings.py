"""Projects' rules on bookings as each member meets them (issue 34's "Done means"): in process and through the real
agent on its socket, each user a process of their own (tests/service/test_service_permissions.py's worlds).

Project A (alice, carol): online and batch, 100 GPU-hours a month, cards 4-7 on weekdays 09:00-19:00 (UTC).
Project B (bob, and the admins' group: carol): experiment only, 20 GPU-hours a month.

The service's clock is the real one, so every booking here is in NEXT month: its budget period lies wholly ahead
(nothing used, whatever the day), and its reset is the first of the month after. Every refusal: one line, exit 4,
nothing written but its audit event.
"""

from __future__ import annotations

import calendar
import re
import time
from datetime import date, datetime, timezone

import pytest

from app.errors import BadInput, Conflict, NotPermitted
from tests.service.support import BOARD, run_as
from tests.service.test_service_permissions import HOUR, opened_world, uid
from tests.unix_users import ADMIN_GROUP
from tests.users.conftest import unix_users  # noqa: F401 - the users, as tests/users has them

pytestmark = pytest.mark.real_users

PROJECTS = f"""
[policy]
timezone = "UTC"
max_ahead_days = 70

[[projects]]
name = "A"
members = ["alice", "carol"]
classes = ["online", "batch"]
gpu_hours = 100

[[projects.allocations]]
cards = [4, 5, 6, 7]
hours = "09:00-19:00"
days = "mon-fri"

[[projects]]
name = "B"
members = ["bob", "@{ADMIN_GROUP}"]
classes = ["experiment"]
gpu_hours = 20
"""


def next_month() -> tuple[date, date]:
    """The first Monday of next month (UTC) and the first of the month after (its budget's reset)."""
    today = datetime.now(timezone.utc).date()
    first = date(today.year + today.month // 12, today.month % 12 + 1, 1)
    monday = first.replace(day=1 + (7 - first.weekday()) % 7)
    return monday, date(first.year + first.month // 12, first.month % 12 + 1, 1)


MONDAY, RESET = next_month()


def at(hour: float, day: int = 0) -> int:
    """Epoch seconds of `hour` o'clock (UTC) on MONDAY + `day` days."""
    return calendar.timegm(MONDAY.timetuple()) + int((day * 24 + hour) * HOUR)


RESETS = re.escape(f"it resets {RESET.isoformat()} 00:00") + r" \(in \d+ days\)"


@pytest.fixture(scope="module", params=["local", "socket"])
def world(request):
    for made in opened_world(request, "board-projects-", 33000, PROJECTS):
        made.root.call("list")  # the database is made (in process, on first use)
        yield made


@pytest.fixture
def members(world):
    """The module's world; after the test root cancels every booking ahead, so the next has its budgets whole."""
    yield world
    ahead = world.root.call("list", start=int(time.time()))["bookings"]
    for booking in ahead:
        world.root.call("cancel", id=booking["id"])


def book(world, user: str, cards, start: int, hours: float, **more) -> dict:
    return world[user].call("book", cards=cards, start=start, end=start + int(hours * HOUR), **more)


def refused_alike(world, user: str, action: str, error, call, booking_id=None) -> str:
    """`call()` is refused with `error` (exit 4 for a rule), in one line, writing nothing but its audit event."""
    before, mark = world.written(), world.mark()
    with pytest.raises(error) as refused:
        call()
    message = str(refused.value)
    assert "\n" not in message and (error is not NotPermitted or refused.value.exit_code == 4)
    assert world.written() == before
    assert world.refusals_since(mark) == [(user, uid(user), action, booking_id)]
    return message


def test_a_member_of_b_booking_online_is_refused_naming_the_class_and_who_may(members):
    """Nearest wrong versions: the project's classes never checked, the project that may left unnamed, a count or an
    --asap booking let through where named cards are refused."""
    for how in ({"cards": [0]}, {"count": 1}, {"count": 1, "or_later": True}):
        said = refused_alike(members, "bob", "create", NotPermitted, lambda: members["bob"].call(
            "book", **how, start=at(20), end=at(21), **{"class": "online"}))
        assert said == "project B may not use class online (project A may); its classes are experiment"
    assert book(members, "alice", [0], at(20), 1, **{"class": "online"})["project"] == "A"


def test_bs_twentieth_hour_is_accepted_and_its_twenty_first_refused_naming_the_budget_and_the_reset(members):
    """19 card-hours (a 2-card booking of 4 h, 11 h on one card), the 20th fits exactly, the 21st is refused.
    Nearest wrong versions: the boundary by one hour, used and booked swapped, the cards not multiplied in, the reset
    a day off (Jan 31 or Feb 2), another project's hours counted in B's."""
    book(members, "bob", [0, 1], at(20), 4)
    book(members, "bob", [2], at(0, day=1), 11)
    book(members, "alice", [3], at(0, day=1), 30, **{"class": "batch"})  # A's: not B's budget
    assert book(members, "bob", [3], at(12, day=2), 1)["project"] == "B"
    said = refused_alike(members, "bob", "create", NotPermitted, lambda: book(members, "bob", [3], at(13, day=2), 1))
    assert re.fullmatch(re.escape("project B's budget is 20 GPU-hours a month: 0.0 h used and 20.0 h booked ahead,"
                                  " this booking needs 1.0 h; ") + RESETS + "; book less, or ask an admin; .*", said)


def test_as_allocation_refuses_bs_named_cards_and_a_count_takes_other_cards_and_as_member_books_it(members):
    """Nearest wrong versions: the allocation applied to named cards only (a count of 4 takes cards 4-7), the
    allocation refusing its own project, its end inclusive (B's booking from 19:00 refused)."""
    said = refused_alike(members, "bob", "create", NotPermitted, lambda: book(members, "bob", [4], at(10), 1))
    assert said.startswith("card 4: project A's allocation (mon-fri 09:00-19:00 UTC); pick other cards or a time"
                           " outside it; ")
    assert members["bob"].call("book", count=4, start=at(10), end=at(11))["cards"] == [0, 1, 2, 3]
    said = refused_alike(members, "bob", "create", Conflict, lambda: members["bob"].call(
        "book", count=4, start=at(10), end=at(11)))
    assert said.startswith("no 4 cards are free for an experiment booking at ")  # 4-7 free, but not his
    assert book(members, "bob", [4], at(19), 1)["cards"] == [4]
    assert book(members, "alice", [4, 5, 6, 7], at(10), 2, **{"class": "online"})["cards"] == [4, 5, 6, 7]


def test_an_admins_force_passes_the_budget_and_is_audited_and_a_members_force_does_not(members):
    """Nearest wrong versions: the admin check dropped (bob's --force passes), the forced booking not audited as
    past the budget."""
    book(members, "bob", [0], at(0), 20)
    said = refused_alike(members, "bob", "create", NotPermitted, lambda: book(members, "bob", [1], at(0), 1, force=True))
    assert said.startswith("project B's budget is 20 GPU-hours a month: 0.0 h used and 20.0 h booked ahead")
    with pytest.raises(BadInput, match=r"^carol is in projects A, B; pick one with --project$"):
        book(members, "carol", [1], at(0), 1, force=True)
    mark = members.mark()
    forced = book(members, "carol", [1], at(0), 2, force=True, project="B")
    assert (forced["user"], forced["project"]) == ("carol", "B")
    assert any(note.startswith("past the budget by an admin: project B's budget is 20 GPU-hours a month: 0.0 h"
                               " used and 20.0 h booked ahead, this booking needs 2.0 h") for note in forced["notes"])
    [event] = members.events_since(mark)
    assert event[:5] == ("carol", uid("carol"), "create", forced["id"], True)
    assert event[5]["force"] is True and event[5]["project"] == "B"
    assert event[5]["over_budget"].startswith("past the budget by an admin: project B's budget")


def test_extend_move_and_reassign_past_the_budget_into_the_allocation_or_to_a_non_member_are_refused(members):
    """Nearest wrong versions: the budget checked on booking only (an extend or a move takes B past it), a move or a
    reassign onto cards in A's hours let through, a reassign to a non-member of the booking's project let through."""
    first = book(members, "bob", [0], at(0), 10)
    late = book(members, "bob", [4], at(19), 2)  # A's cards, after A's hours
    said = refused_alike(members, "bob", "extend", NotPermitted,
                         lambda: members["bob"].call("extend", id=first["id"], end=at(20)), first["id"])
    assert said.startswith("project B's budget is 20 GPU-hours a month: 0.0 h used and 2.0 h booked ahead, this"
                           " booking needs 20.0 h")
    said = refused_alike(members, "carol", "move", NotPermitted,
                         lambda: members["carol"].call("move", id=first["id"], start=at(1), end=at(21)), first["id"])
    assert said.startswith("project B's budget is 20 GPU-hours a month")
    said = refused_alike(members, "carol", "move", NotPermitted,
                         lambda: members["carol"].call("move", id=late["id"], start=at(17), end=at(19)), late["id"])
    assert said.startswith("card 4: project A's allocation (mon-fri 09:00-19:00 UTC)")
    said = refused_alike(members, "carol", "reassign", NotPermitted,
                         lambda: members["carol"].call("reassign", id=first["id"], user="alice"), first["id"])
    assert said == (f"alice is not a member of project B, which booking {first['id']} is for; give it to a member"
                    f" (bob, @{ADMIN_GROUP})")
    early = book(members, "bob", [1], at(10), 1)
    said = refused_alike(members, "carol", "reassign", NotPermitted,
                         lambda: members["carol"].call("reassign", id=early["id"], cards=[5]), early["id"])
    assert said.startswith("project A's allocation (mon-fri 09:00-19:00 UTC); pick other cards")
    assert members["bob"].call("extend", id=first["id"], end=at(17))["end"] == at(17)  # 17 + 2 + 1 = 20
    assert members["carol"].call("reassign", id=first["id"], user="carol")["user"] == "carol"


def test_a_series_whose_occurrences_together_pass_the_budget_is_refused_whole(members):
    """Eleven evenings of 2 h: 22 h, each alone within 20. Nearest wrong versions: each occurrence checked alone
    (all booked), the first ten booked and the eleventh dropped."""
    rule = {"cards": [0], "every": "day", "start": "20:00", "until": "22:00", "from": MONDAY.isoformat()}
    last = date.fromordinal(MONDAY.toordinal() + 10).isoformat()
    series_rows = members.rows("SELECT count(*) FROM series")
    said = refused_alike(members, "bob", "series", NotPermitted, lambda: members["bob"].call("series_book", **rule, to=last))
    assert re.fullmatch(re.escape("project B's budget is 20 GPU-hours a month: 0.0 h used and 0.0 h booked ahead, this"
                                  " series needs 22.0 h; ") + RESETS + "; book less, or ask an admin", said)
    assert members.rows("SELECT count(*) FROM series") == series_rows
    ten = members["bob"].call("series_book", **rule, to=date.fromordinal(MONDAY.toordinal() + 9).isoformat())
    assert len(ten["bookings"]) == 10 and {b["project"] for b in ten["bookings"]} == {"B"}
    members.root.call("series_cancel", id=ten["series"]["id"])


@pytest.mark.parametrize("world", ["socket"], indirect=True)
def test_the_refusals_through_the_real_command_line_are_one_line_and_exit_4(members):
    """bob's own `board book` (the quick path) against the agent: the class and the budget, exit 4, one line on
    stderr, nothing on stdout."""
    env = {"BOARD_CONFIG": str(members.agent.config), "TZ": "UTC", "PATH": "/usr/bin:/bin", "HOME": "/"}
    start = datetime.fromtimestamp(at(20), timezone.utc).strftime("%Y-%m-%d %H:%M")
    result = run_as("bob", "env", *(f"{k}={v}" for k, v in env.items()), str(BOARD), "book", "--cards", "0", "--start",
                    start, "--for", "2h", "--class", "online")
    assert (result.returncode, result.stdout) == (4, "")
    assert result.stderr == "board: project B may not use class online (project A may); its classes are experiment\n"
    book(members, "bob", [1], at(0), 20)
    result = run_as("bob", "env", *(f"{k}={v}" for k, v in env.items()), str(BOARD), "book", "--cards", "0", "--start",
                    start, "--for", "2h")
    assert (result.returncode, result.stdout, result.stderr.count("\n")) == (4, "", 1)
    assert result.stderr.startswith("board: project B's budget is 20 GPU-hours a month: 0.0 h used and 20.0 h booked"
                                    " ahead, this booking needs 2.0 h; it resets ")


# -- a board without [[projects]] ------------------------------------------------------------------------------------

NO_PROJECTS = "this board has no projects, so there is no project 'X'; leave out --project"


def test_without_projects_naming_one_is_exit_2_in_one_line_and_nothing_else_changes(client, cli):
    """The default config (no [[projects]]), both transports and stores, the real command line: book (the quick
    path), a series and the slot searches refuse --project as bad input, writing nothing, not even an audit row; the
    same booking without it is the old shape (no "project" on the wire). Nearest wrong versions: --project ignored
    (the booking made as if it counted for something), refused by rule (exit 4) with an audit row, a booking's wire
    growing a "project": "" for every old client."""
    from tests.service.test_behaviour import BOOKING_KEYS, everything, events_of, tomorrow

    start = tomorrow()
    before, events_before = everything(client), events_of(client)
    for args in (["book", "--cards", "0", "--start", "tomorrow 10:00", "--for", "1h", "--project", "X"],
                 ["book", "2", "--asap", "--for", "1h", "--project", "X"],
                 ["book", "--cards", "0", "--every", "day", "--start", "10:00", "--until", "11:00", "--to",
                  datetime.fromtimestamp(start + 3 * 86400, timezone.utc).date().isoformat(), "--project", "X"]):
        assert cli(*args) == (2, "", f"board: {NO_PROJECTS}\n"), args
    for op, args in (("plan", {"count": 1, "start": start, "end": start + HOUR}),
                     ("next_free", {"cards": [0], "start": start, "end": start + HOUR}),
                     ("slots", {"count": 1, "start": start, "end": start + HOUR})):
        with pytest.raises(BadInput) as refused:
            client.call(op, **args, project="X")
        assert str(refused.value) == NO_PROJECTS and refused.value.exit_code == 2
    assert everything(client) == before and events_of(client) == events_before
    booking = client.call("book", cards=[0], start=start, end=start + HOUR)
    assert set(booking) == BOOKING_KEYS and "project" not in booking


# -- the budget under a race, on PostgreSQL -------------------------------------------------------------------------

RACER = """
import json, sys
from app.client.local import LocalClient
from app.config import load_config
from app.core.identity import Identity
from app.errors import BoardError
from app.service import open_service
service = open_service(load_config(environ={"BOARD_CONFIG": sys.argv[1]}), demo=None, environ={"BOARD_SIMULATE": "1"})
client = LocalClient(service, Identity(sys.argv[2], int(sys.argv[3]), False))  # two members: no lock of one user's
client.call("list")  # connected, the fleet read: the race is the booking alone
print("ready", flush=True)
for line in sys.stdin:
    try:
        reply = {"result": client.call("book", **json.loads(line))}
    except BoardError as error:
        reply = {"code": error.exit_code, "message": str(error)}
    print(json.dumps(reply), flush=True)
"""


def test_two_processes_racing_for_a_budgets_last_hours_on_postgresql_one_wins(pg_cluster, tmp_path):
    """Two services (processes, connections) on one PostgreSQL store, two members of B each booking 2 h on a card of
    their own when 18 of 20 are booked, told to go at once: exactly one wins, the other is refused naming the budget;
    five rounds. Nearest wrong version: a booking on named cards taking only its cards' and its holder's locks (as
    one without a budget may), so both read 18 h before either writes."""
    import json
    import subprocess
    import sys

    from app.client.local import LocalClient
    from app.config import load_config
    from tests.service.support import REPO

    url = pg_cluster.fresh_database()
    try:
        config = tmp_path / "board.toml"
        config.write_text(f'[storage]\ndb = "{tmp_path / "board.db"}"\nurl = "{url}"\n'
                          + PROJECTS.replace('members = ["bob", "@', 'members = ["root", "racer1", "racer2", "@'))
        me = LocalClient.open(load_config(environ={"BOARD_CONFIG": str(config)}), demo=None,
                              environ={"BOARD_SIMULATE": "1"})
        racers = [subprocess.Popen([sys.executable, "-c", RACER, str(config), f"racer{n}", str(60000 + n)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO) for n in (1, 2)]
        try:
            assert [r.stdout.readline() for r in racers] == ["ready\n"] * 2
            for day in range(5):
                first = me.call("book", cards=[0], start=at(0, day=day), end=at(18, day=day), project="B")
                for card, racer in zip((1, 2), racers):
                    racer.stdin.write(json.dumps({"cards": [card], "start": at(20, day=day),
                                                  "end": at(22, day=day), "project": "B"}) + "\n")
                for racer in racers:
                    racer.stdin.flush()
                replies = [json.loads(r.stdout.readline()) for r in racers]
                won = [r["result"] for r in replies if "result" in r]
                lost = [r for r in replies if "code" in r]
                assert len(won) == 1 and len(lost) == 1, replies
                assert lost[0]["code"] == 4 and lost[0]["message"].startswith(
                    "project B's budget is 20 GPU-hours a month: 0.0 h used and 20.0 h booked ahead, this booking"
                    " needs 2.0 h"), lost
                for booking in (first, *won):
                    me.call("cancel", id=booking["id"])
        finally:
            for racer in racers:
                racer.stdin.close()
                racer.wait(timeout=30)
            me.close()
    finally:
        pg_cluster.drop(url)
