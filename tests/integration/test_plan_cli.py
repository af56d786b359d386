"""`board serve plan` as a member runs it (file mode, the real CLI): fit-checked like `serve start`, refused unless
--force, the model under [llama] model_dirs, and listed with its next start. Starting one for real is the runner's
(tests/llama/test_servers_service.py::TestPlannedServers)."""

from __future__ import annotations

import json
import re
from datetime import date

from tests.conftest import day, run_board
from tests.fit import shapes


def test_a_plan_is_fit_checked_against_the_booked_cards_and_listed(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    model = shapes.write_model(models / "gqa8.gguf", "gqa8")
    config = tmp_path / "board.toml"
    config.write_text(f'[llama]\nmodel_dirs = ["{models}"]\n')
    env = {"BOARD_CONFIG": str(config), "BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": "1"}
    booked = run_board("book", "--cards", "2", "--start", "tomorrow 9:00", "--for", "2h", "--json", env=env)
    assert booked.returncode == 0, booked.stderr
    booking = json.loads(booked.stdout)["id"]

    # 10M tokens of KV cache (4 KiB each) do not fit one 32 GB card: refused, one line, nothing planned.
    too_big = run_board("serve", "plan", str(booking), "--model", str(model), "--ctx", "10000000", env=env)
    assert too_big.returncode == 4 and len(too_big.stderr.strip().splitlines()) == 1, too_big.stderr
    assert too_big.stderr.startswith("board: serve plan: gqa8.gguf does not fit"), too_big.stderr
    assert json.loads(run_board("serve", "plan", "--list", "--json", env=env).stdout) == {"plans": []}

    planned = run_board("serve", "plan", str(booking), "--model", str(model), "--ctx", "4096", "--alias", "team",
                        "--json", env=env)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["alias"] == "team" and plan["ctx"] == 4096 and plan["next_booking"] == booking
    listed = run_board("serve", "list", env=env).stdout
    assert f"planned {plan['id']}: team" in listed and f"(booking {booking})" in listed
    assert json.loads(run_board("serve", "list", "--json", env=env).stdout)["planned"][0]["id"] == plan["id"]

    elsewhere = tmp_path / "elsewhere.gguf"
    shapes.write_model(elsewhere, "tiny")
    outside = run_board("serve", "plan", str(booking), "--model", str(elsewhere), env=env)
    assert outside.returncode == 2 and "model_dirs" in outside.stderr, outside.stderr
    nothing = run_board("serve", "plan", env=env)
    assert nothing.returncode == 2 and "give a booking or --series" in nothing.stderr


def test_plans_say_their_next_start_as_every_other_line_does(tmp_path):
    """`serve plan`, `serve list` and `serve plan --list` word the next start as `board list` does ('Tue 09:00'),
    not as an ISO stamp. The zone is pinned; the weekday is the booked day's, whatever today is."""
    models = tmp_path / "models"
    models.mkdir()
    model = shapes.write_model(models / "gqa8.gguf", "gqa8")
    config = tmp_path / "board.toml"
    config.write_text(f'[llama]\nmodel_dirs = ["{models}"]\n')
    env = {"BOARD_CONFIG": str(config), "BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": "1",
           "TZ": "Asia/Kolkata"}  # +05:30: an ISO stamp or a UTC time would show
    start = date.fromisoformat(day(3))
    booked = run_board("book", "--cards", "2", "--start", f"{start} 09:00", "--for", "2h", "--json", env=env)
    assert booked.returncode == 0, booked.stderr
    booking = json.loads(booked.stdout)["id"]
    when = f"{start:%a} 09:00"

    planned = run_board("serve", "plan", str(booking), "--model", str(model), "--alias", "team", env=env)
    assert planned.returncode == 0, planned.stderr
    assert f"team, next start {when} (in " in planned.stdout, planned.stdout
    listed = run_board("serve", "list", env=env).stdout
    assert f"starts {when} (in " in listed, listed
    table = run_board("serve", "plan", "--list", env=env).stdout
    assert f"{when} (booking {booking})" in table, table
    for out in (planned.stdout, listed, table):
        assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", out), out
