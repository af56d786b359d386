"""`board key` and `board usage` as a member runs them (the real CLI, file mode on a database of one's own): the
key printed once, lists that never show it, and each refusal one line on stderr with its exit code, nothing
written. Through the service as real users: tests/llama/test_gateway.py."""

from __future__ import annotations

import json
import sqlite3

import pytest

from tests.conftest import run_board


@pytest.fixture
def board(tmp_path):
    env = {"BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": "1", "TZ": "UTC"}

    def run(*args: str):
        return run_board(*args, env=env)

    run.db = tmp_path / "board.db"
    return run


def test_new_list_revoke(board):
    made = board("key", "new", "--name", "laptop", "--models", "team-llm, other", "--class", "online",
                 "--expires", "90d", "--json")
    assert made.returncode == 0, made.stderr
    key = json.loads(made.stdout)
    assert key["key"].startswith("bk-") and key["models"] == ["team-llm", "other"] and key["class"] == "online"
    assert key["expires"] is not None and key["name"] == "laptop"
    listed = board("key", "list")
    assert listed.returncode == 0 and key["fingerprint"] in listed.stdout and key["key"] not in listed.stdout
    plain = board("key", "new")
    assert plain.returncode == 0 and plain.stdout.splitlines()[0].startswith("bk-")
    assert "shown only now" in plain.stdout
    assert board("key", "revoke", str(key["id"])).returncode == 0
    again = board("key", "revoke", str(key["id"]))
    assert again.returncode == 3 and again.stderr.count("\n") == 1 and "already revoked" in again.stderr
    rows = json.loads(board("key", "list", "--all", "--json").stdout)
    assert [(r["id"], r["revoked"] is not None) for r in rows] == [(2, False), (1, True)]
    usage = board("usage", "--json", "--since", "1d")
    assert usage.returncode == 0 and json.loads(usage.stdout)["rows"] == []


@pytest.mark.parametrize("args, code, says", [
    (("key", "revoke", "99"), 2, "no key 99"),
    (("key", "new", "--class", "gold"), 2, "invalid choice"),
    (("key", "new", "--expires", "soon"), 2, "--expires"),
    (("key", "new", "--models", "a\x07b"), 2, "not a model alias"),
    (("key",), 2, "say which key action"),
    (("usage", "--by", "color"), 2, "invalid choice"),
])
def test_refusals_are_one_line_and_write_nothing(board, args, code, says):
    result = board(*args)
    assert result.returncode == code and says in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1
    if board.db.exists():
        assert sqlite3.connect(board.db).execute("SELECT COUNT(*) FROM api_keys").fetchone()[0] == 0
