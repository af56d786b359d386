"""bench/bench_load.py, small: real users alice and bob write concurrently; no overlap, no unhandled error.

The full run (32 processes x 50 attempts) is `sudo .venv/bin/python bench/bench_load.py`; its
figures are in the issue's closing note. This keeps the script working and its checks honest.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.users.conftest import MEMBERS_GROUP, REPO

pytestmark = pytest.mark.users  # real Unix users; skipped with the reason when not root


def test_bench_load_small_run_as_two_real_users(unix_users):
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_load.py"), "--procs", "6", "--attempts", "15", "--hours", "24",
         "--users", "alice,bob", "--group", MEMBERS_GROUP, "--json"],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads(result.stdout)
    board, checks = figures["board"], figures["checks"]
    assert figures["as_real_users"] and board["users"] == ["alice", "bob"]
    assert board["attempts"] == 90 and board["outcomes"]["error"] == 0, board["errors"]
    assert board["outcomes"]["booked"] > 0 and board["outcomes"]["conflict"] > 0  # they really contended
    assert checks["overlaps"] == 0 and checks["integrity"] == "ok" and checks["audit_chain_intact"]
    assert checks["uids"] == sorted(unix_users[u].pw_uid for u in ("alice", "bob"))
    assert figures["raw"]["attempts"] == 90 and figures["ratio"] > 0
