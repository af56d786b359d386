"""The board on a config with projects ([[projects]]): each project's allocation on the calendar, the project beside
the holder, the booking form's project choice and budget line; other people's names inert; and a board without
projects as it always was (the other snapshot tests, unchanged, and the form here).

Update the snapshots with the whole TUI suite (see test_tui_snapshots) and look at them first.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from textual.widgets import Input, Select, Static

from app.config import Config, Project, ProjectAllocation
from app.tui.screens.booking_form import BookingModal
from app.tui.screens.card_detail import CardDetailScreen
from tests.tui.conftest import BOB, HOSTILE_NOTE, HOSTILE_USER, ready, seed, simulated, wait_for
from tests.tui.test_tui_behaviour import bookings

SIZES = pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])

# The two projects: A holds cards 0-3 on weekdays 09-19 (the view's Monday morning), B cards 6-7 on Sunday
# evening (today, 18-22). Alice is in both, so her form asks which.
PROJECTS = Config(projects=(
    Project("A", ("alice", "bob"), classes=("online", "batch", "finetune"), gpu_hours=100.0,
            allocations=(ProjectAllocation(cards=(0, 1, 2, 3), hours="09:00-19:00", days="mon-fri"),)),
    Project("B", ("alice", "carol"), classes=("experiment",), gpu_hours=20.0,
            allocations=(ProjectAllocation(cards=(6, 7), hours="18:00-22:00", days="sun"),)),
))
# B's budget this month (November; now is Sunday 29th 15:30): carol's booking on card 3 from Saturday 31 Oct 23:00
# for 6 h counts its 5 h in November, her 14:00-17:00 one 1.5 h used and 1.5 h ahead: 6.5 used, 1.5 booked.
OCTOBER_TAIL = ("carol", (3,), -688, 6, "experiment", "october's tail")
B_LINE = "B: 12.0 of 20 GPU-hours left this month, resets 1 Dec"
# A: alice's 0,1 13:00-19:00 (5 h used, 7 ahead) and Monday 21:00-05:00 (6 ahead in November), bob's card 2 from
# Saturday 19:00 for 44 h (20.5 used, 23.5 ahead): 25.5 used, 36.5 booked.
A_LINE = "A: 38.0 of 100 GPU-hours left this month, resets 1 Dec"


def with_projects(db: Path, projects: dict[str, str]) -> None:
    """Each user's seeded bookings for their project, as `board book --project` would have stored them."""
    conn = sqlite3.connect(db)
    with conn:
        for user, project in projects.items():
            conn.execute("UPDATE bookings SET project = ? WHERE user = ?", (project, user))
    conn.close()


@pytest.fixture
def projects_db(tmp_path) -> Path:
    db = tmp_path / "projects.db"
    seed(db, simulated(), extra=(OCTOBER_TAIL,))
    with_projects(db, {"alice": "A", "bob": "A", "carol": "B"})
    return db


class TestProjectsOnTheBoard:
    @SIZES
    def test_allocations_shaded_and_the_project_beside_the_holder(self, snap_compare, make_app, projects_db, size):
        """A's rows 0-3 shaded from Monday 09:00, B's 6-7 Sunday 18-22 under erin's booking on 7, each with its
        row ('holds cards 0-3'); the holders 'alice·A', 'bob·A', 'carol·B'; erin's (no project) as before."""
        assert snap_compare(make_app(config=PROJECTS, db_path=projects_db), terminal_size=size, run_before=ready)

    async def test_the_line_under_the_timeline_names_the_allocation_and_the_bookings_project(self, make_app,
                                                                                            projects_db):
        """Wrong versions: a free cell in A's window described as plain free (the refusal comes as a surprise), the
        window's hours in another zone than the policy's, the project left out of a booking's line."""
        app = make_app(config=PROJECTS, db_path=projects_db)
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            await pilot.press("tab", "down", "down", "down", *["right"] * 36)  # card 3, Monday 09:30
            detail = app.board.query_one("#detail", Static)
            await wait_for(pilot, lambda: "Mon 09:30" in str(detail.render()))
            assert str(detail.render()) == ("card 3 free at Mon 09:30 · project A's allocation (mon-fri 09:00-19:00"
                                            " UTC) · b books")
            await pilot.press("left", "left")  # Monday 08:30: nobody's
            await wait_for(pilot, lambda: "Mon 08:30" in str(detail.render()))
            assert "allocation" not in str(detail.render())
            await pilot.press("t", "up")  # now, card 2: bob's booking
            await wait_for(pilot, lambda: str(detail.render()).startswith("#2 "))
            assert str(detail.render()).startswith("#2 bob · project A · card 2 · ")

    async def test_the_admin_list_names_each_bookings_project_beside_its_holder(self, make_app, projects_db):
        from tests.tui.conftest import ERIN_ADMIN
        from app.tui.screens.admin import AdminScreen

        app = make_app(identity=ERIN_ADMIN, config=PROJECTS, db_path=projects_db)
        async with app.run_test(size=(120, 40)) as pilot:
            await ready(pilot)
            await pilot.press("a")
            await wait_for(pilot, lambda: isinstance(app.screen, AdminScreen) and len(app.screen.bookings) >= 6)
            table = app.screen.query_one("#all-bookings")
            users = {str(table.get_row(key)[0]): str(table.get_row(key)[1]) for key in table.rows}
            assert (users["2"], users["3"], users["4"]) == ("bob·A", "carol·B", "erin")

    @pytest.mark.parametrize("size", [(120, 40)], ids=["120x40"])
    def test_markup_in_project_and_member_names_is_inert(self, snap_compare, make_app, tmp_path, size):
        """A project name and a holder with markup, escapes and bidi characters, on the timeline's project row, the
        card table's holder and the line under the timeline: shown as text (wrong version: a name drawn as markup,
        bold red, or its escape reaching the terminal)."""
        hostile = "[bold red]ops[/]\x1b[31m\u202e"
        config = Config(projects=(Project(hostile, (HOSTILE_USER,), allocations=(
            ProjectAllocation(cards=(4, 5), hours="16:00-20:00"),)),))
        db = tmp_path / "hostile.db"
        seed(db, simulated(), extra=((HOSTILE_USER, (4,), -1, 3, "experiment", HOSTILE_NOTE),))
        with_projects(db, {HOSTILE_USER: hostile})

        async def cursor_on_it(pilot):
            await ready(pilot)
            await pilot.press("tab", "down", "down", "down", "down")

        assert snap_compare(make_app(config=config, db_path=db), terminal_size=size, run_before=cursor_on_it)

    @pytest.mark.parametrize("size", [(120, 40)], ids=["120x40"])
    def test_card_detail_has_a_project_column(self, snap_compare, make_app, projects_db, size):
        async def detail(pilot):
            await ready(pilot)
            await pilot.press("enter")  # card 0: alice's two bookings, A's
            await wait_for(pilot, lambda: isinstance(pilot.app.screen, CardDetailScreen)
                           and pilot.app.screen.points is not None)

        assert snap_compare(make_app(config=PROJECTS, db_path=projects_db), terminal_size=size, run_before=detail)


async def open_form(pilot) -> BookingModal:
    await ready(pilot)
    await pilot.press("down", "down", "down", "down", "b")  # card 4, free until Monday 11:00
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, BookingModal))
    return pilot.app.screen


class TestBookingFormProjects:
    @SIZES
    def test_the_form_asks_which_project_and_shows_its_budget(self, snap_compare, make_app, projects_db, size):
        async def form(pilot):
            screen = await open_form(pilot)  # on B: A may not use experiment
            await wait_for(pilot, lambda: "needs" in str(screen.query_one("#budget", Static).render()))

        assert snap_compare(make_app(config=PROJECTS, db_path=projects_db), terminal_size=size, run_before=form)

    async def test_the_budget_line_follows_the_project_and_the_booking_and_the_booking_carries_it(
            self, make_app, projects_db):
        """The line for the chosen project, from its period's bookings only (wrong versions: October's hours
        counted, booked hours left out of what is left, another project's bookings counted, the line not following
        the choice, the choice opening on a project that may not use the class), what this booking needs once the
        service accepts it, and the project sent with `book`."""
        app = make_app(config=PROJECTS, db_path=projects_db)
        async with app.run_test(size=(120, 40)) as pilot:
            form = await open_form(pilot)
            budget = form.query_one("#budget", Static)
            assert [str(option[0]) for option in form.query_one("#project", Select)._options] == ["A", "B"]
            # It opens on B, her first project that may use the form's class (experiment); A may not.
            await wait_for(pilot, lambda: str(budget.render()) == f"{B_LINE} · this booking needs 2.0 h")
            form.query_one("#project", Select).value = "A"  # the service refuses: no share of A's budget to show
            await wait_for(pilot, lambda: form.error is not None and "class experiment" in form.error)
            await wait_for(pilot, lambda: str(budget.render()) == A_LINE)
            form.query_one("#project", Select).value = "B"
            await wait_for(pilot, lambda: str(budget.render()) == f"{B_LINE} · this booking needs 2.0 h")
            form.query_one("#duration", Input).value = "13h"  # 13 card-hours: past B's 12 left
            await wait_for(pilot, lambda: form.error is not None and "budget" in form.error)
            assert str(budget.render()) == B_LINE
            assert "project B's budget is 20 GPU-hours a month: 6.5 h used and 1.5 h booked ahead" in form.error
            form.query_one("#duration", Input).value = "3h"
            await wait_for(pilot, lambda: str(budget.render()) == f"{B_LINE} · this booking needs 3.0 h")
            await pilot.press("enter")
            await wait_for(pilot, lambda: not isinstance(app.screen, BookingModal))
        made = [b for b in bookings(projects_db) if b.user == "alice" and b.cards == (4,)]
        assert [(b.project, b.klass, b.end - b.start) for b in made] == [("B", "experiment", 3 * 3600)]

    async def test_a_member_of_one_project_gets_no_choice_but_its_budget(self, make_app, projects_db):
        app = make_app(identity=BOB, config=PROJECTS, db_path=projects_db)
        async with app.run_test(size=(120, 40)) as pilot:
            form = await open_form(pilot)
            assert not form.query("#project")
            assert form.request().project == "A"
            budget = form.query_one("#budget", Static)
            await wait_for(pilot, lambda: str(budget.render()).startswith(A_LINE))

    async def test_a_board_without_projects_has_no_project_nor_budget_and_sends_none(self, make_app, seeded_db):
        """Wrong versions: a budget line or an empty project choice on a board without projects, a `project` sent
        (the service would refuse it: 'this board has no projects')."""
        app = make_app()
        async with app.run_test(size=(120, 40)) as pilot:
            form = await open_form(pilot)
            assert not form.query("#project") and not form.query("#budget")
            assert form.request().project is None and "project" not in form.request().args()
            await wait_for(pilot, lambda: "✓" in str(form.query_one("#message", Static).render()))
            await pilot.press("enter")
            await wait_for(pilot, lambda: not isinstance(app.screen, BookingModal))
        made = [b for b in bookings(seeded_db) if b.user == "alice" and b.cards == (4,)]
        assert [b.project for b in made] == [""]


def test_the_budget_line_over_and_without_a_budget():
    from app.tui.backend import Budget

    reset = 1796083200  # 1 Dec 2026 00:00 UTC
    over = Budget("B", 20.0, "week", 19.0, 2.5, -1.5, reset, True)
    assert over.line(None) == "B: 1.5 GPU-hours over its 20 this week, resets 1 Dec"
    assert Budget("A", None, "month", 3.0, 0.0, None, reset, True).line(None) == "A: no GPU-hour budget"
