"""What each project has and spends (`board projects`, the report per project, `board usage --by project`, the project
beside the holder), on the issue's two projects: A (online and batch, 100 GPU-hours a month, cards 0-3 on weekdays
09:00-19:00) and B (experiment, 20 GPU-hours). In process with a clock the test moves (bookings made then left in
the past), the real CLI's handlers on the same service; and the real agent through its socket."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone

import pytest

from app.client.local import LocalClient
from app.config import load_config
from app.core.identity import Identity
from app.errors import BadInput
from app.history.store import Sample
from app.output import booking_json, booking_line
from app.gpu import open_source
from app.gpu.fleet import Fleet
from app.gpu.simulated import demo_uid
from app.service import Service
from tests.conftest import FROZEN_NOW, Clock

H = 3600
PROJECTS = """
[policy]
timezone = "UTC"

[[projects]]
name = "A"
members = ["alice", "carol"]
classes = ["online", "batch"]
gpu_hours = 100
tokens_per_day = 50000
rpm = 60
tpm = 20000
share = 2.0

[[projects.allocations]]
cards = [0, 1, 2, 3]
hours = "09:00-19:00"
days = "mon-fri"

[[projects]]
name = "B"
members = ["bob", "carol"]
classes = ["experiment"]
gpu_hours = 20
"""


def utc(text: str) -> int:
    """'2026-11-26 16:00' in UTC, as epoch seconds (the policy zone of PROJECTS)."""
    return int(datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp())


@dataclass
class Board:
    service: Service
    clock: Clock

    def as_(self, user: str) -> LocalClient:
        return LocalClient(self.service, Identity(user, demo_uid(user), False))

    def cli(self, user: str, *argv: str, capsys) -> tuple[int, str, str]:
        """The real command's handler, its client `user`'s on this service (the clock the test moves)."""
        from app.cli import build_parser
        from app.cli.context import Context, run_command

        args = build_parser().parse_args(list(argv))
        rc = run_command(args.handler, Context(args, client=self.as_(user)))
        out, err = capsys.readouterr()
        return rc, out, err


def make_board(tmp_path, text: str, now: float, url: str | None = None) -> Board:
    """The service on PROJECTS (or `text`) at `now`: its SQLite file in tmp_path, or the PostgreSQL database `url`."""
    path = tmp_path / "board.toml"
    path.write_text(f'[storage]\ndb = "{tmp_path / "board.db"}"\n' + (f'url = "{url}"\n' if url else "") + text)
    config = load_config(environ={"BOARD_CONFIG": str(path)})
    clock = Clock(now)
    return Board(Service(config, Fleet(open_source(True, clock=clock), 1.0), clock=clock), clock)


@pytest.fixture
def board(tmp_path, set_tz, store):
    set_tz("UTC")
    made = make_board(tmp_path, PROJECTS, utc("2026-10-31 20:00"), getattr(store, "url", None))
    yield made
    made.service.close()


def book(client: LocalClient, cards: list[int], start: str, end: str, klass: str, **extra) -> dict:
    return client.call("book", cards=cards, start=utc(start), end=utc(end), **{"class": klass}, **extra)


def usage_row(board: Board, ts: int, project: str, prompt: int, completion: int, user: str = "alice") -> None:
    """A gateway accounting row as the gateway will record it, with its key's project."""
    board.service.conn.execute(
        'INSERT INTO gateway_usage (ts, fingerprint, "user", model, status, prompt_tokens, completion_tokens, project)'
        " VALUES (?, 'fp', ?, 'm', 200, ?, ?, ?)", (ts, user, prompt, completion, project))
    board.service.conn.commit()


def the_month(board: Board) -> dict[str, dict]:
    """November for A and B, seen at FROZEN_NOW (Sunday 2026-11-29 15:30 UTC), each booking made while it was ahead.

    A (alice): cards 4,5 on Thu 26th 16-18 (4 card-h) and card 0, in its allocation, 17-18 (1): 5 h used; cards 4,5
    from Mon 30th 22:00 to Tue 1st 02:00: 4 h booked before the reset (the other 4 are December's).
    B (bob): card 6 from Sat 31 Oct 22:00 to 1 Nov 02:00 (2 h of it November's), on the 26th 16-19 (3), and today
    14:30-16:30, across now (1 h used, 1 ahead): 6 h used, 1 booked; card 7 on the 27th (5 h) cancelled; carol's
    card 7 on 1 Dec for B (December's). Gateway tokens: A 300 since midnight (and 2000 a second before it), B 15,
    and 14 of no project."""
    alice, bob, carol = board.as_("alice"), board.as_("bob"), board.as_("carol")
    made = {"oct": book(bob, [6], "2026-10-31 22:00", "2026-11-01 02:00", "experiment")}
    board.clock.now = utc("2026-11-26 12:00")
    made["a_thu"] = book(alice, [4, 5], "2026-11-26 16:00", "2026-11-26 18:00", "batch")
    made["a_held"] = book(alice, [0], "2026-11-26 17:00", "2026-11-26 18:00", "online")
    made["b_thu"] = book(bob, [6], "2026-11-26 16:00", "2026-11-26 19:00", "experiment")
    gone = book(bob, [7], "2026-11-27 10:00", "2026-11-27 15:00", "experiment")
    bob.call("cancel", id=gone["id"])
    made["b_now"] = book(bob, [6], "2026-11-29 14:30", "2026-11-29 16:30", "experiment")
    made["a_reset"] = book(alice, [4, 5], "2026-11-30 22:00", "2026-12-01 02:00", "batch")
    made["carol_dec"] = book(carol, [7], "2026-12-01 09:00", "2026-12-01 11:00", "experiment", project="B")
    board.clock.now = FROZEN_NOW
    usage_row(board, utc("2026-11-29 00:00"), "A", 100, 200)
    usage_row(board, utc("2026-11-29 00:00") - 1, "A", 1000, 1000)
    usage_row(board, utc("2026-11-29 15:00"), "B", 10, 5, user="bob")
    usage_row(board, utc("2026-11-29 15:00"), "", 7, 7)
    return made


def test_projects_json_shows_each_projects_used_and_booked_hours_this_period_exactly(board, capsys):
    """`board projects --json` at FROZEN_NOW (the_month). Wrong versions: the period starting a day early (B's
    October hours counted: 8 used) or late (its 1 November hours left out: 4), or its reset counted into it (A's
    December hours: 8 booked; carol's: B 3 booked); the cancelled booking counted (B 11 used); another project's
    bookings counted (A with B's hours); a booking across now counted all as used or all as booked (B 7/0, 5/2);
    the tokens since 24 hours ago (A 2300) or of every project ('' counted); members, limits or `mine` not the
    config's."""
    the_month(board)
    rc, out, err = board.cli("alice", "projects", "--json", capsys=capsys)
    assert (rc, err) == (0, "")
    doc = json.loads(out)
    assert (doc["now"], doc["zone"], doc["note"]) == ("2026-11-29T15:30:00+00:00", "UTC", None)
    month = {"period": "month", "period_start": "2026-11-01T00:00:00+00:00", "resets_at": "2026-12-01T00:00:00+00:00"}
    assert doc["projects"] == [
        {"name": "A", "members": ["alice", "carol"], "classes": ["online", "batch"],
         "allocations": [{"cards": [0, 1, 2, 3], "pool": None, "hours": "09:00-19:00", "days": "mon-fri"}],
         "gpu_hours": 100.0, **month, "used_hours": 5.0, "booked_hours": 4.0, "remaining_hours": 91.0,
         "tokens_per_day": 50000, "tokens_today": 300, "rpm": 60, "tpm": 20000, "share": 2.0, "mine": True},
        {"name": "B", "members": ["bob", "carol"], "classes": ["experiment"], "allocations": [],
         "gpu_hours": 20.0, **month, "used_hours": 6.0, "booked_hours": 1.0, "remaining_hours": 13.0,
         "tokens_per_day": None, "tokens_today": 15, "rpm": None, "tpm": None, "share": 1.0, "mine": False},
    ]
    assert [p["mine"] for p in board.as_("carol").call("projects")["projects"]] == [True, True]
    assert [p["mine"] for p in board.as_("dave").call("projects")["projects"]] == [False, False]


def test_the_table_a_line_per_allocation_and_whose_projects(board, capsys):
    """The text: a row per project with its budget and use, its allocations in the policy zone, the caller's projects.
    Wrong versions: the budget's period or the day's token budget left out; LEFT without the booked hours taken off;
    a project's name or members shown raw (a control character in a name is impossible: the config refuses it, so
    this checks what the table prints for the names it has)."""
    the_month(board)
    rc, out, err = board.cli("alice", "projects", capsys=capsys)
    assert (rc, err) == (0, "")
    assert [line.split() for line in out.splitlines()] == [
        ["PROJECT", "MEMBERS", "CLASSES", "BUDGET", "USED", "BOOKED", "LEFT", "RESETS", "TOKENS", "TODAY"],
        ["A", "alice,carol", "online,batch", "100", "h/month", "5.0", "h", "4.0", "h", "91.0", "h", "Tue", "00:00",
         "300/50000"],
        ["B", "bob,carol", "experiment", "20", "h/month", "6.0", "h", "1.0", "h", "13.0", "h", "Tue", "00:00", "15"],
        ["A", "holds", "cards", "0,1,2,3", "mon-fri", "09:00-19:00", "UTC"],
        ["your", "projects:", "A"],
    ]
    assert board.cli("dave", "projects", capsys=capsys)[1].splitlines()[-1] == \
        "you are in no project; ask an admin to add you"


def test_a_weeks_budget_starts_on_monday_at_local_midnight(tmp_path, set_tz, capsys):
    """period = "week" in Europe/Berlin: Monday 00:00 Berlin (23:00 UTC on Sunday) to the next. At Sunday 23:30 UTC
    a booking that ran 22:30-23:30 UTC is half last week's. Wrong versions: the week from UTC midnight (1 h used, or
    none), from Sunday, or a month."""
    set_tz("UTC")
    text = PROJECTS.replace('timezone = "UTC"', 'timezone = "Europe/Berlin"').replace(
        "gpu_hours = 20\n", 'gpu_hours = 20\nperiod = "week"\n')
    made = make_board(tmp_path, text, utc("2026-11-29 12:00"))
    try:
        book(made.as_("bob"), [6], "2026-11-29 22:30", "2026-11-29 23:30", "experiment")
        made.clock.now = utc("2026-11-29 23:30")
        b = made.as_("bob").call("projects")["projects"][1]
        assert (b["period_start"], b["resets_at"]) == (utc("2026-11-29 23:00"), utc("2026-12-06 23:00"))
        assert (b["used_hours"], b["booked_hours"], b["remaining_hours"]) == (0.5, 0.0, 19.5)
    finally:
        made.service.close()


def test_the_report_has_booked_against_used_per_project(board, capsys):
    """The report's `projects`: booked card-hours to now (the calendar's) and used (the holder's processes at the
    busy mark, from the history) per project, whatever `--by` says. Card 4 ran alice's job 16-18 on the 26th at 58 %,
    card 5 sat idle; card 6 ran bob's 16-17, idle 17-19. Wrong versions: the rows keyed by user or class; a booking's
    busy time given to another project; the cancelled booking's hours booked; no `projects` on a board with them."""
    the_month(board)
    history = board.service.history
    samples = []
    for card, user_busy in ((4, (utc("2026-11-26 16:00"), utc("2026-11-26 18:00"))),
                            (5, None), (6, (utc("2026-11-26 16:00"), utc("2026-11-26 17:00")))):
        uuid = f"GPU-5090sim-0000-0000-0000-{card:012d}"
        history.card_id(uuid, card, "RTX 5090", 32607)
        last = utc("2026-11-26 19:00") if card == 6 else utc("2026-11-26 18:00")
        for t in range(utc("2026-11-26 16:00"), last, 300):
            busy = user_busy is not None and user_busy[0] <= t < user_busy[1]
            samples.append(Sample(ts=t, uuid=uuid, state="IN USE" if busy else "BOOKED", dt=300,
                                  util=58 if busy else 0))
    history.add(samples)
    history.roll_up(FROZEN_NOW)
    doc = board.as_("alice").call("report", since_s=7 * 86400, by="class")
    found = {r["key"]: (r["bookings"], r["booked_h"], r["used_h"], r["idle_h"]) for r in doc["projects"]}
    assert found == {"A": (2, 5.0, 2.0, 2.0), "B": (2, 4.0, 1.0, 2.0)}
    assert [r["key"] for r in doc["rows"]] == ["batch", "experiment", "online"]  # --by still groups the rows
    rc, out, err = board.cli("alice", "report", "--since", "7d", capsys=capsys)
    assert rc == 0 and err == ""
    part = out[out.index("Per project"):].splitlines()
    assert [line.split()[:5] for line in part[1:4]] == [
        ["PROJECT", "BOOKED", "h", "USED", "h"], ["A", "5.0", "2.0", "40", "%"], ["B", "4.0", "1.0", "25", "%"]]


def test_usage_by_project_sums_the_gateways_records_per_project(board, capsys):
    """`usage --by project`: a row per project (the records' own column), most tokens first, '' for records of no
    project (shown "(none)"). Wrong versions: grouped by user (alice's '' row merged into A); the project not named
    in the row; the column missing from the table."""
    the_month(board)
    doc = board.as_("bob").call("usage", since=0, by="project")
    assert [(r["project"], r["requests"], r["prompt_tokens"], r["completion_tokens"], r["user"]) for r in doc["rows"]] \
        == [("A", 2, 1100, 1200, "alice"), ("B", 1, 10, 5, "bob"), ("", 1, 7, 7, "alice")]
    assert "project" not in board.as_("bob").call("usage", since=0, by="user")["rows"][0]  # its old shape
    rc, out, err = board.cli("bob", "usage", "--by", "project", "--since", "400d", capsys=capsys)
    assert (rc, err) == (0, "")
    assert [line.split()[:5] for line in out.splitlines()] == [
        ["PROJECT", "USER", "KEY", "MODEL", "REQUESTS"], ["A", "alice", "fp", "m", "2"], ["B", "bob", "fp", "m", "1"],
        ["(none)", "alice", "fp", "m", "1"]]


def test_a_booking_line_names_its_project_beside_the_holder(board):
    """`board list` and every confirmation (app.output.booking_line), and `--json`: `project` where the booking has
    one. Wrong versions: the project left out, or shown for a booking of no project (a board without projects)."""
    made = the_month(board)
    booking = board.as_("alice").call("get", id=made["a_reset"]["id"])
    line = booking_line(booking, FROZEN_NOW)
    assert line.startswith(f"#{booking['id']:<5} alice (project A) cards 4,5"), line
    assert booking_json(booking)["project"] == "A"
    bare = {k: v for k, v in booking.items() if k != "project"}
    assert "project" not in booking_line(bare, FROZEN_NOW) and "project" not in booking_json(bare)


# -- a board without projects, and the real agent ------------------------------------------------------------------


def test_a_board_without_projects_keeps_its_old_shapes(client, cli):
    """Through either transport, no [[projects]]: `board projects` says so in one line (exit 0, an empty list in
    JSON); a booking, its line, the report and `usage` are as they always were; `usage --by project` is one line,
    exit 2. Wrong versions: `project: ""` on the wire or in --json; "(project )" in a line; a `projects` key or
    section in the report; usage grouped by an empty project instead of refused."""
    from app.service.ops.projects import NO_PROJECTS
    from tests.service.test_behaviour import tomorrow

    assert cli("projects") == (0, NO_PROJECTS + "\n", "")
    rc, out, err = cli("projects", "--json")
    assert rc == 0 and err == "" and (json.loads(out)["projects"], json.loads(out)["note"]) == ([], NO_PROJECTS)
    start = tomorrow()
    made = client.call("book", cards=[3], start=start, end=start + H)
    assert "project" not in made and "project" not in client.call("get", id=made["id"])
    rc, out, err = cli("list")
    line = next(line for line in out.splitlines() if line.startswith(f"#{made['id']} "))
    assert rc == 0 and "project" not in line, line
    rc, out, err = cli("list", "--json")
    assert rc == 0 and all("project" not in b for b in json.loads(out)["bookings"])
    rc, out, err = cli("report", "--since", "7d", "--json")
    assert rc == 0 and "projects" not in json.loads(out)
    rc, out, err = cli("report", "--since", "7d")
    assert rc == 0 and "Per project" not in out
    rc, out, err = cli("usage", "--by", "project")
    assert (rc, out) == (2, "") and err == ("board: this board has no projects ([[projects]]), so usage is not kept by"
                                            " project; use --by user, key or model\n")
    with pytest.raises(BadInput, match="no projects"):
        client.call("usage", by="project")


@pytest.mark.real_users
def test_through_the_agents_socket_a_member_sees_her_projects_use_and_her_bookings_name_it(make_agent):
    """The real agent with A and B (root, the CLI's caller here, a member of A): `board book` books for A without
    --project and its confirmation and `board list` name it; `board projects --json` has its booked hours (those
    before the reset) and the shape docs/json.md shows. Wrong versions: the booking not tagged with the caller's only
    project; the hours of another project; a key printed and not documented (or the other way)."""
    from tests.service.support import board_cli
    from tests.unit.test_json_docs import Reader, example, mismatches

    agent = make_agent(start=False)
    with open(agent.config, "a") as config:
        config.write(PROJECTS.replace('members = ["alice", "carol"]', 'members = ["root", "alice"]'))
    agent.start()
    env = {"BOARD_CONFIG": str(agent.config)}
    rc, out, err = board_cli("book", "--cards", "4,5", "--start", "+1h", "--for", "1h", "--class", "batch", env=env)
    assert rc == 0, err
    assert re.match(r"booked #\d+ +root \(project A\) cards 4,5 ", out), out
    rc, out, err = board_cli("list", env=env)
    assert rc == 0 and "root (project A) cards 4,5" in out, out
    rc, out, err = board_cli("projects", "--json", env=env)
    assert rc == 0, err
    doc = json.loads(out)
    (booking,) = agent.client().call("list")["bookings"]
    reset = int(datetime.fromisoformat(doc["projects"][0]["resets_at"]).timestamp())
    ahead = round(2 * max(0, min(booking["end"], reset) - booking["start"]) / H, 2)
    assert [(p["name"], p["used_hours"], p["booked_hours"], p["mine"]) for p in doc["projects"]] == [
        ("A", 0.0, ahead, True), ("B", 0.0, 0.0, False)]
    shape = Reader(example("json.md", "`board projects --json` prints one object:")).shape()
    assert mismatches(shape, doc, "", set()) == []
    rc, out, err = board_cli("projects", env=env)
    assert rc == 0 and out.splitlines()[-1] == "your projects: A", out


def test_what_is_left_is_what_the_budget_lets_a_member_book(board):
    """`remaining_hours` and the budget's refusal count alike: B has 13.0 h left at FROZEN_NOW, so bob books 13 h
    and then not half an hour more (exit 4, the one line naming the budget, use and reset). Wrong versions: the view
    or the check counting another project's hours, the cancelled ones, or the December ones."""
    from app.errors import NotPermitted

    the_month(board)
    bob = board.as_("bob")
    assert bob.call("projects")["projects"][1]["remaining_hours"] == 13.0
    book(bob, [7], "2026-11-29 17:00", "2026-11-30 06:00", "experiment")
    assert bob.call("projects")["projects"][1]["remaining_hours"] == 0.0
    with pytest.raises(NotPermitted) as refused:
        book(bob, [7], "2026-11-30 06:00", "2026-11-30 06:30", "experiment")
    assert str(refused.value).startswith(
        "project B's budget is 20 GPU-hours a month: 6.0 h used and 14.0 h booked ahead, this booking needs 0.5 h;"
        " it resets Tue 00:00 (in 32 h); book less, or ask an admin;"), str(refused.value)
