"""Issue 12's budget: 8 cards for a year of history in 50 MB or less, on a synthetic year (bench/bench_history.py).

The file is written as the service would hold it after a year: 365 days of 5-minute rollups and the last 48 h of
raw samples with their users, through HistoryStore. The assertion is on bytes, never on time.
"""

from __future__ import annotations

import importlib.util

from tests.conftest import REPO


def _bench():
    spec = importlib.util.spec_from_file_location("bench_history", REPO / "bench" / "bench_history.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_year_of_eight_cards_fits_in_50_mb(tmp_path):
    figures = _bench().synthetic_year(tmp_path / "board.history.db", days=365, cards=8)
    assert figures["rows"]["rollups"] == 8 * 365 * 288  # every card, every 5 minutes, a whole year
    assert figures["rows"]["samples"] == 8 * 48 * 360  # and 48 h of raw samples every 10 s
    assert figures["bytes"] <= 50_000_000, figures
