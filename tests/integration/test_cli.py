"""The quick CLI as a user runs it: a real subprocess, a real database file, the simulated fleet."""

import json
import os
import re
import sys
from datetime import datetime, timedelta, timezone

import pytest

from tests.conftest import run_board


@pytest.fixture
def board(tmp_path):
    env = {"BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": "1", "TZ": "UTC"}

    def run(*args, extra_env=None):
        return run_board(*args, env={**env, **(extra_env or {})})

    return run


def ok(result):
    assert result.returncode == 0, result.stderr
    return result


def ok_json(result):
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return json.loads(result.stdout)


BOOKING_KEYS = {"id", "user", "cards", "card_uuids", "host", "start", "end", "class", "note", "status",
                "requested_at", "queued", "series_id", "notice"}


class TestJsonShapes:
    def test_book_prints_the_booking_with_iso_times(self, board):
        # 4 and 7: idle, and under one switch (a group across switches gets a note on stderr)
        booking = ok_json(board("book", "--cards", "4,7", "--for", "90m", "--class", "batch", "--note", "eval", "--json"))
        assert set(booking) == BOOKING_KEYS
        assert booking["cards"] == [4, 7] and len(booking["card_uuids"]) == 2
        start, end = datetime.fromisoformat(booking["start"]), datetime.fromisoformat(booking["end"])
        assert start.utcoffset() is not None and (end - start).total_seconds() == 90 * 60
        assert (booking["class"], booking["note"], booking["status"]) == ("batch", "eval", "booked")

    def test_times_are_shown_in_the_callers_zone(self, board):
        booking = ok_json(board("book", "1", "--start", "tomorrow 9:00", "--for", "1h", "--json",
                                extra_env={"TZ": "Asia/Tokyo"}))
        assert booking["start"].endswith("T09:00:00+09:00")
        listed = ok_json(board("list", "--json", extra_env={"TZ": "UTC"}))
        assert listed["bookings"][0]["start"].endswith("T00:00:00+00:00")

    def test_status(self, board):
        ok(board("book", "--cards", "3", "--for", "1h"))
        status = ok_json(board("status", "--json"))
        assert status["simulated"] is True
        assert [c["index"] for c in status["cards"]] == list(range(8))
        card = status["cards"][3]
        for key in ("host", "index", "uuid", "name", "memory_total_mib", "memory_used_mib", "utilization_pct",
                    "temperature_c", "power_w", "state", "booking", "next_booking", "processes"):
            assert key in card
        assert card["state"] == "BOOKED" and set(card["booking"]) == BOOKING_KEYS
        states = {c["index"]: c["state"] for c in status["cards"]}
        assert states[0] == "SQUATTED" and states[4] == "FREE"  # alice runs on 0 without a booking
        assert status["cards"][6]["processes"][0]["user"] == "container/unknown"
        assert "HOT" in status["cards"][7]["warnings"]

    def test_list_filters(self, board):
        # Absolute times two days on: every command means the same instants, however long apart they run.
        day = (datetime.now(timezone.utc) + timedelta(days=2)).date().isoformat()
        for card, hour in ((0, "10"), (1, "12"), (2, "14")):
            ok(board("book", "--cards", str(card), "--start", f"{day}T{hour}:00", "--for", "1h"))
        ok(board("cancel", "2"))

        def cards(*args):
            return [b["cards"] for b in ok_json(board("list", *args, "--json"))["bookings"]]

        assert cards() == [[0], [2]]
        assert [b["status"] for b in ok_json(board("list", "--all", "--json"))["bookings"]] == [
            "booked", "cancelled", "booked"]
        # windows are half-open: a booking that ends at --from, or starts at --to, is outside
        assert cards("--from", f"{day}T10:30", "--to", f"{day}T14:00") == [[0]]
        assert cards("--from", f"{day}T10:30", "--to", f"{day}T14:01") == [[0], [2]]
        assert cards("--from", f"{day}T11:00") == [[2]]
        assert cards("--from", f"{day}T10:30", "--to", f"{day}T14:00", "--all") == [[0], [1]]
        result = board("list", "--user", "nobody-here", "--json")
        assert result.returncode == 2 and "no user 'nobody-here'" in result.stderr

    def test_log_and_whoami(self, board):
        ok(board("book", "--cards", "0", "--for", "1h"))
        events = ok_json(board("log", "--json"))["events"]
        assert events[0]["action"] == "create" and events[0]["ok"] is True
        me = ok_json(board("whoami", "--json"))
        assert me["uid"] == os.getuid() and me["admin"] is (os.getuid() == 0)


class TestErrors:
    @pytest.mark.parametrize(
        "args, code, message",
        [
            (["book", "--cards", "0"], 2, "say how long"),
            (["book", "--for", "1h"], 2, "say which cards"),
            (["book", "3", "--for", "1h"], 2, "1, 2, 4 or 8 cards"),
            (["book", "--cards", "0", "--for", "soon"], 2, "can't read"),
            (["book", "--cards", "0", "--start", "yesterday", "--for", "1h"], 2, "can't read"),
            (["book", "--cards", "0", "--start", "2020-01-01T10:00", "--for", "1h"], 2, "in the past"),
            (["book", "--cards", "x", "--for", "1h"], 2, "can't read cards"),
            (["book", "--cards", "12", "--for", "1h"], 2, "unknown card 12"),
            (["book", "--cards", "0", "--for", "1h", "--class", "vip"], 2, "unknown class"),
            (["book", "--cards", "0", "--for", "100h"], 4, "at most 72 h"),
            (["cancel", "999"], 2, "no booking 999"),
            (["cancel", "abc"], 2, "invalid int value"),
            (["frobnicate"], 2, "invalid choice"),
            (["extend", "1"], 2, "one of the arguments --for --until is required"),
            (["admin"], 2, "admin reassign"),
            (["run"], 2, "give a command"),
            (["run", "--", "true"], 4, "no active booking"),
        ],
    )
    def test_one_line_with_the_documented_exit_code(self, board, args, code, message):
        result = board(*args)
        assert result.returncode == code, result.stderr
        assert message in result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
        assert result.stdout == ""

    def test_conflict_exits_3(self, board):
        ok(board("book", "--cards", "0", "--for", "2h"))
        result = board("book", "--cards", "0", "--start", "+1h", "--for", "1h")
        assert result.returncode == 3 and "booked by" in result.stderr and "next free start" in result.stderr

    def test_no_driver_is_one_clear_line(self, tmp_path):
        result = run_board("status", env={"BOARD_DB": str(tmp_path / "b.db"), "PATH": os.environ["PATH"]})
        assert result.returncode == 1
        assert result.stderr == "board: no NVIDIA driver found; use --demo to explore a simulated server\n"

    def test_bad_config_is_bad_input(self, board, tmp_path):
        config = tmp_path / "board.toml"
        config.write_text("[policy\nmax_booking_hours = 3")
        result = board("status", extra_env={"BOARD_CONFIG": str(config)})
        assert result.returncode == 2 and f"can't read config {config}" in result.stderr


class TestRun:
    def test_run_sees_only_the_booked_cards(self, board):
        booking = ok_json(board("book", "--cards", "7,4", "--for", "1h", "--json"))  # idle, one switch: no notes
        code = ("import os; e = os.environ;"
                " print(e['CUDA_DEVICE_ORDER'], e['CUDA_VISIBLE_DEVICES'], e['NVIDIA_VISIBLE_DEVICES'])")
        result = board("run", "--", sys.executable, "-c", code)
        assert result.returncode == 0, result.stderr
        uuids = ",".join(booking["card_uuids"])
        assert result.stdout.split() == ["PCI_BUS_ID", uuids, uuids]

    def test_run_exit_code_is_the_commands(self, board):
        ok(board("book", "--cards", "4", "--for", "1h"))
        assert board("run", "--", sys.executable, "-c", "raise SystemExit(7)").returncode == 7

    def test_run_without_an_active_booking_refuses(self, board):
        ok(board("book", "--cards", "4", "--start", "+1h", "--for", "1h"))
        result = board("run", "--", "true")
        assert result.returncode == 4 and "no active booking" in result.stderr


def test_help_lists_every_command(board):
    result = ok(board("--help"))
    listing = result.stdout.split("commands:\n", 1)[1].split("\n\n", 1)[0]
    # Only the command list has lines indented by exactly four spaces: a name, then its help.
    names = re.findall(r"^ {4}(\S+)", listing, flags=re.MULTILINE)
    assert names == ["status", "book", "list", "ical", "cancel", "release", "extend", "admin", "series", "run", "wait",
                     "log", "whoami", "cards", "topo", "power", "backup", "doctor", "migrate", "serve", "fit", "notify",
                     "faults", "alerts", "report", "monitoring", "projects", "models", "key", "usage", "gateway", "agent",
                     "runner", "completion"]
    # no `init`: the retired shared 2770 directory


class TestDemo:
    """`--demo` seeds a realistic day in the user's state directory; the options work before or after the command."""

    def demo_env(self, tmp_path):
        return {"XDG_STATE_HOME": str(tmp_path / "state"), "TZ": "UTC"}

    @pytest.mark.parametrize("args", [["--demo", "status", "--json"], ["status", "--demo", "--json"]])
    def test_demo_shows_every_state(self, tmp_path, args):
        status = ok_json(run_board(*args, env=self.demo_env(tmp_path)))
        assert status["simulated"] is True
        states = [c["state"] for c in status["cards"]]
        assert {"FREE", "BOOKED", "IN USE", "SQUATTED"} <= set(states)
        assert (tmp_path / "state" / "board" / "demo.db").exists()

    def test_demo_seeds_once(self, tmp_path):
        env = self.demo_env(tmp_path)
        first = ok_json(run_board("--demo", "list", "--json", env=env))["bookings"]
        again = ok_json(run_board("list", "--demo", "--json", env=env))["bookings"]
        assert len(first) >= 5 and [b["id"] for b in again] == [b["id"] for b in first]

    def test_scenario_file(self, tmp_path):
        scenario = tmp_path / "two.toml"
        scenario.write_text('[cards]\ncount = 2\nname = "NVIDIA A100"\n[faults]\nlost = [1]\n')
        status = ok_json(run_board("status", "--demo", "--scenario", str(scenario), "--json", env=self.demo_env(tmp_path)))
        assert [(c["name"], c["state"]) for c in status["cards"]] == [("NVIDIA A100", "BOOKED"), ("NVIDIA A100", "LOST")]

    @pytest.mark.parametrize("who", ["frank", "dave"])  # frank holds bookings in the demo; dave is of its team
    def test_an_admin_gives_a_booking_to_one_of_the_demos_people(self, tmp_path, who):
        from app.core.identity import lookup_user

        if lookup_user(who) is not None or os.getuid() != 0:
            pytest.skip(f"needs root (an admin) and no account named {who} on this machine")
        env = self.demo_env(tmp_path)
        erins = next(b for b in ok_json(run_board("--demo", "list", "--json", env=env))["bookings"] if b["user"] == "erin")
        result = run_board("--demo", "admin", "reassign", str(erins["id"]), "--user", who, "--json", env=env)
        assert result.returncode == 0, result.stderr  # not "no user 'frank' on this server"
        after = ok_json(run_board("--demo", "list", "--json", env=env))["bookings"]
        assert next(b for b in after if b["id"] == erins["id"])["user"] == who
        result = run_board("--demo", "admin", "reassign", str(erins["id"]), "--user", "nobody-here", env=env)
        assert result.returncode == 2 and "no user 'nobody-here'" in result.stderr  # a made-up name is not one

    def test_a_scenario_process_without_a_uid_is_its_users_own(self, tmp_path):
        """The one running the demo writes a scenario with their own job on card 0 (no uid): booking a card
        now does not pass it over as someone else's, as a made-up uid for their name made it."""
        import pwd

        me = pwd.getpwuid(os.getuid()).pw_name
        scenario = tmp_path / "mine.toml"
        scenario.write_text(f'[cards]\ncount = 2\n[[processes]]\ncard = 0\npid = 4242\nused_mib = 2048\nuser = "{me}"\n'
                            '[[processes]]\ncard = 1\npid = 4343\nused_mib = 1024\nuser = "bob"\n')
        env = {"BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": str(scenario), "TZ": "UTC"}
        result = run_board("book", "1", "--for", "1h", env=env)
        assert result.returncode == 0, result.stderr
        assert " cards 0 " in result.stdout
        assert result.stderr == "board: note: passed over card 1 (bob's processes, 1.0 GiB)\n"
        status = ok_json(run_board("status", "--json", env=env))
        assert [c["state"] for c in status["cards"]] == ["IN USE", "SQUATTED"]

    def test_a_bad_scenario_is_bad_input(self, tmp_path):
        scenario = tmp_path / "bad.toml"
        scenario.write_text("[cards]\ncount = 'eight'\n")
        result = run_board("status", "--scenario", str(scenario), env=self.demo_env(tmp_path))
        assert result.returncode == 2 and str(scenario) in result.stderr and result.stderr.count("\n") == 1


class TestTimeWords:
    """Issue 11: --until reads day words from now, as --start does; a bare time and +DUR from the start."""

    @pytest.mark.parametrize("start, until, hours", [
        ("tomorrow 14:00", "tomorrow 16:00", 2),  # booked 26 hours before: "tomorrow" was read from the start's day
        ("tomorrow 14:00", "16:00", 2),
        ("tomorrow 14:00", "+3h", 3),
        ("tomorrow 22:00", "6:00", 8),  # the first 06:00 after the start
        ("tomorrow 14:00", "9:00", 19),
    ])
    def test_until(self, board, start, until, hours):
        booking = ok_json(board("book", "--cards", "0", "--start", start, "--until", until, "--json"))
        span = datetime.fromisoformat(booking["end"]) - datetime.fromisoformat(booking["start"])
        assert span == timedelta(hours=hours)

    @pytest.mark.parametrize("start, until", [("tomorrow 14:00", "today 16:00"), ("tomorrow 14:00", "tomorrow 14:00")])
    def test_an_end_at_or_before_the_start_is_exit_2_showing_both(self, board, start, until):
        result = board("book", "--cards", "0", "--start", start, "--until", until)
        assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1
        end = until.split()[1]
        assert re.match(rf"board: the end \w{{3}} \d\d \w{{3}} {end} is at or before the start \w{{3}} \d\d \w{{3}} 14:00;",
                        result.stderr), result.stderr
        assert ok_json(board("list", "--json"))["bookings"] == []  # nothing written

    def test_tonight_is_the_configured_night_start(self, board, tmp_path):
        config = tmp_path / "board.toml"
        config.write_text('[booking]\nnight_start = "23:59"\n')
        before = datetime.now(timezone.utc)
        result = board("book", "--cards", "1", "--start", "tonight", "--for", "1h", "--json",
                       extra_env={"BOARD_CONFIG": str(config)})
        assert result.returncode == 0, result.stderr
        # Not ok_json: in the minute from 23:59 the booking starts now, and card 1's processes get a note on stderr.
        start = datetime.fromisoformat(json.loads(result.stdout)["start"])
        if before.strftime("%H:%M") < "23:59":
            assert (start.date(), start.hour, start.minute) == (before.date(), 23, 59)
        else:  # already night: tonight is now
            assert start - before < timedelta(minutes=1)

    def test_this_weekend(self, board):
        # The rule on each day is tests/unit/test_timeparse.py's, on a pinned clock; here the CLI reads it from its own
        # now, so the test holds on any day: card 3 runs nothing and is not hot (no note when it starts now, on a
        # weekend), and the start is the one for the clock before or after the command (a midnight in between).
        before = datetime.now(timezone.utc)
        booking = ok_json(board("book", "--cards", "3", "--start", "this weekend", "--for", "1h", "--json"))
        after = datetime.now(timezone.utc)
        start = datetime.fromisoformat(booking["start"])
        saturdays = {(t + timedelta(days=5 - t.weekday())).replace(hour=9, minute=0, second=0, microsecond=0)
                     for t in (before, after) if t.weekday() < 5}
        weekend_nows = [t for t in (before, after) if t.weekday() >= 5]
        assert start in saturdays or any(abs(start - t) < timedelta(minutes=1) for t in weekend_nows), (before, start)

    @pytest.mark.parametrize("cards, booked", [("4-7", [4, 5, 6, 7]), ("0-1,4", [0, 1, 4]), ("0,1", [0, 1])])
    def test_card_lists(self, board, cards, booked):
        # stdout alone: cards 0 and 1 run someone's processes, so stderr has notes
        assert json.loads(ok(board("book", "--cards", cards, "--for", "1h", "--json")).stdout)["cards"] == booked

    def test_a_bad_card_list_is_one_line(self, board):
        result = board("book", "--cards", "7-4", "--for", "1h")
        assert result.returncode == 2 and result.stderr == (
            "board: can't read cards '7-4' (the range 7-4 runs backwards); give indexes such as 0,1 or 4-7\n")

    def test_confirmations_say_how_far_away(self, board):
        booked = ok(board("book", "--cards", "3", "--start", "+2h", "--for", "1h")).stdout
        # (late in the day the times are tomorrow's, and say so)
        assert re.search(r" (\w{3} )?\d\d:\d\d \(in 2 h\) → (\w{3} )?\d\d:\d\d \(in 3 h\)  experiment", booked), booked
        extended = ok(board("extend", "1", "--for", "1h")).stdout
        assert extended.startswith("extended #1 ") and "(in 2 h) → " in extended and "(in 4 h)" in extended
        cancelled = ok(board("cancel", "1")).stdout
        assert cancelled.startswith("cancelled #1 ") and "(in 2 h) → " in cancelled, cancelled

    def test_not_active_now_says_when_it_starts(self, board):
        ok(board("book", "--cards", "3", "--start", "+2h", "--for", "1h"))
        result = board("run", "--booking", "1", "--", "true")
        assert result.returncode == 4
        assert re.fullmatch(r"board: booking 1 is not active now \(starts \d\d:\d\d, in 2 h\)\n", result.stderr) or \
            re.fullmatch(r"board: booking 1 is not active now \(starts \w{3} \d\d:\d\d, in 2 h\)\n", result.stderr), \
            result.stderr

    @pytest.mark.parametrize("until, end", [
        ("15:00", "T15:00"),  # the first 15:00 after the current end (tomorrow 12:00)
        ("9:00", "T09:00"),  # ... which is the day after
        ("+1h", "T13:00"),  # after the current end
        ("tomorrow 18:00", "T18:00"),  # day words from now
    ])
    def test_extend_until_reads_from_the_current_end(self, board, until, end):
        booking = ok_json(board("book", "--cards", "2", "--start", "tomorrow 10:00", "--for", "2h", "--json"))
        extended = ok_json(board("extend", "1", "--until", until, "--json"))
        old_end, new_end = datetime.fromisoformat(booking["end"]), datetime.fromisoformat(extended["end"])
        assert extended["end"][10:16] == end
        assert timedelta(0) < new_end - old_end < timedelta(days=1)

    def test_extend_until_before_the_current_end_shows_both(self, board):
        ok(board("book", "--cards", "2", "--start", "tomorrow 10:00", "--for", "2h"))
        result = board("extend", "1", "--until", "tomorrow 11:00")
        assert result.returncode == 2 and re.match(
            r"board: the end \w{3} \d\d \w{3} 11:00 is at or before the current end \w{3} \d\d \w{3} 12:00;", result.stderr)


def _last_sunday(month: int) -> str:
    """The next last Sunday of `month` after today: where Europe/Berlin's clocks change (March: forward, October: back)."""
    from calendar import monthrange

    year = datetime.now(timezone.utc).year
    while True:
        last = datetime(year, month, monthrange(year, month)[1])
        sunday = last - timedelta(days=(last.weekday() - 6) % 7)
        if sunday.date() > datetime.now(timezone.utc).date() + timedelta(days=1):
            return sunday.date().isoformat()
        year += 1


class TestClockChanges:
    """Issue 17: a wall time the clocks skip is refused; one they show twice is the first, and the note says so."""

    @pytest.fixture
    def berlin(self, board, tmp_path):
        config = tmp_path / "board.toml"
        config.write_text("[policy]\nmax_ahead_days = 400\n")  # the next clock change is at most a year away
        return lambda *args: board(*args, extra_env={"TZ": "Europe/Berlin", "BOARD_CONFIG": str(config)})

    @pytest.mark.parametrize("args", [("--start", "{day}T02:30", "--for", "1h"), ("--start", "{day} 2-4"),
                                      ("--start", "{day}T01:00", "--until", "{day} 02:30")])
    def test_a_time_the_clocks_skip_is_exit_2_and_writes_nothing(self, berlin, args):
        day = _last_sunday(3)
        result = berlin("book", "--cards", "0", *(a.format(day=day) for a in args))
        when = datetime.fromisoformat(day).strftime("%a %d %b %Y")
        assert (result.returncode, result.stdout) == (2, "")
        assert result.stderr.startswith("board: 02:") and result.stderr.count("\n") == 1
        assert f" does not exist on {when}: the clocks go forward from 02:00 (CET) to 03:00 (CEST); give a time" \
               " before 02:00 or from 03:00 on\n" in result.stderr
        assert ok_json(berlin("list", "--json"))["bookings"] == []

    def test_a_time_shown_twice_is_the_first_and_the_note_says_how_to_write_the_second(self, berlin):
        day = _last_sunday(10)
        first = berlin("book", "--cards", "0", "--start", f"{day}T02:30", "--for", "30m", "--json")
        assert first.returncode == 0, first.stderr
        when = datetime.fromisoformat(day).strftime("%a %d %b %Y")
        assert first.stderr == (f"board: note: 02:30 happens twice on {when} (the clocks go back); took the first"
                                f" (CEST, UTC+02:00); write {day}T02:30+01:00 for the second\n")
        assert json.loads(first.stdout)["start"] == f"{day}T02:30:00+02:00"
        second = ok_json(berlin("book", "--cards", "0", "--start", f"{day}T02:30+01:00", "--for", "30m", "--json"))
        assert second["start"] == f"{day}T02:30:00+01:00"  # an hour after the first: no clash, no note


def test_agent_once_is_refused_where_the_config_names_the_service(tmp_path):
    """On the shared config (root's cron, say) `--once` would enforce the service's own database in this
    process; enforcement belongs to the running service. A config of one's own still works."""
    db = tmp_path / "lib" / "board.db"
    db.parent.mkdir()
    shared = tmp_path / "shared.toml"
    shared.write_text(f'[storage]\ndb = "{db}"\n\n[service]\nsocket = "{tmp_path / "board.sock"}"\n')
    refused = run_board("agent", "--once", env={"BOARD_CONFIG": str(shared), "BOARD_SIMULATE": "1"})
    assert refused.returncode == 2 and refused.stdout == "", refused.stderr
    assert len(refused.stderr.splitlines()) == 1 and "systemctl status board-agent" in refused.stderr
    assert list(db.parent.iterdir()) == []  # the database was not opened, let alone created
    own = tmp_path / "own.toml"
    own.write_text(f'[storage]\ndb = "{db}"\n')
    done = run_board("agent", "--once", "--json", env={"BOARD_CONFIG": str(own), "BOARD_SIMULATE": "1"})
    assert done.returncode == 0 and json.loads(done.stdout) == {"crashed": [], "stopped": [], "warned": []}, done.stderr
