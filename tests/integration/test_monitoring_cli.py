"""`board monitoring dashboard|rules`: the real CLI prints the files shipped in the package, as they are, and
needs no database or service (a team prints them on the Prometheus host)."""

from __future__ import annotations

import json

from app.monitoring import DASHBOARD, RULES, read
from tests.conftest import run_board


def test_the_dashboard_is_printed_as_shipped_and_is_grafana_json(tmp_path):
    """Nearest wrong: the rules printed for the dashboard, or a database opened first (BOARD_DB is a folder)."""
    printed = run_board("monitoring", "dashboard", env={"BOARD_DB": str(tmp_path)})
    assert (printed.returncode, printed.stderr) == (0, "")
    assert printed.stdout == read(DASHBOARD)
    board = json.loads(printed.stdout)
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource", "host", "card"]
    assert {p["datasource"]["uid"] for p in board["panels"] if p["type"] != "row"} == {"${datasource}"}


def test_the_rules_are_printed_as_shipped():
    printed = run_board("monitoring", "rules")
    assert (printed.returncode, printed.stderr, printed.stdout) == (0, "", read(RULES))
    assert printed.stdout.startswith("# board's alert rules for Prometheus")


def test_without_saying_which_it_is_one_line_and_exit_2():
    """Nearest wrong: argparse's usage and a traceback, or exit 0 with nothing printed."""
    for args in (("monitoring",), ("monitoring", "grafana")):
        refused = run_board(*args)
        assert refused.returncode == 2 and refused.stdout == "", args
        assert len(refused.stderr.strip().splitlines()) == 1 and "dashboard" in refused.stderr, refused.stderr
