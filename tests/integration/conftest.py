"""Integration fixtures: the real CLI against a small simulated fleet."""

import pytest

from tests.conftest import run_board

# Four cards; bob (not the caller) runs a 9 GiB job on card 0. No uid: a process is then matched by its user's name,
# so it is bob's and not the caller's whatever uid the caller has (a developer's own may well be 1002).
BOBS_FLEET = """\
[cards]
count = 4

[[processes]]
card = 0
pid = 41001
used_mib = 9216
user = "bob"
"""


@pytest.fixture
def bobs_board(tmp_path):
    """`board ...` in a subprocess, on BOBS_FLEET and a fresh database, in UTC."""
    scenario = tmp_path / "fleet.toml"
    scenario.write_text(BOBS_FLEET)
    env = {"BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": str(scenario), "TZ": "UTC"}
    return lambda *args: run_board(*args, env=env)
