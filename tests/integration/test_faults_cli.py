"""`board faults` in a real subprocess, over a database that holds faults recorded as the service records them."""

from __future__ import annotations

import json
import time

import pytest

from app.faults import store
from app.store.db import connect, write
from tests.conftest import run_board

SIM0 = "GPU-5090sim-0000-0000-0000-000000000000"
SIM3 = "GPU-5090sim-0000-0000-0000-000000000003"


@pytest.fixture
def board(tmp_path):
    env = {"BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": "1", "TZ": "UTC"}
    now = int(time.time())
    conn = connect(tmp_path / "board.db")
    with write(conn):
        store.record(conn, ts=now - 40 * 86400, kind="xid", card_uuid=SIM3, code=48, detail="Xid 48: old")
        store.record(conn, ts=now - 3 * 86400, kind="throttle", card_uuid=SIM0, detail="HW slowdown", duration_s=754)
        store.record(conn, ts=now - 3600, kind="xid", card_uuid=SIM3, code=79,
                     detail="Xid 79: GPU has fallen off the bus")
        store.record(conn, ts=now - 60, kind="oom", card_uuid=None, user="bob\x1b[31m", booking_id=4,
                     detail="server 2: cudaMalloc failed: out of memory")
    conn.close()
    return lambda *args: run_board(*args, env=env)


def test_faults_lists_the_last_30_days_newest_first(board):
    result = board("faults")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith(": 1 xid, 1 oom, 1 throttle, 0 build")
    assert len(lines) == 4  # the Xid 48 is 40 days old
    assert "oom" in lines[1] and "bob\\x1b[31m #4" in lines[1] and "cudaMalloc failed: out of memory" in lines[1]
    assert "card 3" in lines[2] and "Xid 79: GPU has fallen off the bus" in lines[2]
    assert "card 0" in lines[3] and lines[3].endswith("HW slowdown for 12 min 34 s")
    assert "\x1b" not in result.stdout  # another user's text stays inert


def test_faults_json_with_since_and_kind(board):
    result = board("faults", "--since", "60d", "--kind", "xid", "--json")
    assert result.returncode == 0 and result.stderr == ""
    found = json.loads(result.stdout)
    assert found["counts"] == {"xid": 2}
    assert [(f["code"], f["card"], f["card_uuid"]) for f in found["faults"]] == [(79, 3, SIM3), (48, 3, SIM3)]
    assert set(found["faults"][0]) == {"id", "ts", "card_uuid", "card", "kind", "code", "detail", "duration_s",
                                       "booking_id", "user"}
    assert found["faults"][0]["ts"].endswith("+00:00")


@pytest.mark.parametrize("args", [("--since", "soon"), ("--kind", "fire"), ("--since",)])
def test_bad_input_is_exit_2_in_one_line(board, args):
    result = board("faults", *args)
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr
