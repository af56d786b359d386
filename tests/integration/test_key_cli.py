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


@pytest.fixture
def projects_board(tmp_path):
    """File mode as this account (root), under a config whose project R (root's, experiment only) and S (another
    account's) are the board's projects."""
    config = tmp_path / "config.toml"
    config.write_text('[[projects]]\nname = "R"\nmembers = ["root"]\nclasses = ["experiment"]\n\n'
                      '[[projects]]\nname = "S"\nmembers = ["someone-else"]\n')
    env = {"BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": "1", "TZ": "UTC", "BOARD_CONFIG": str(config)}

    def run(*args: str):
        return run_board(*args, env=env)

    run.db = tmp_path / "board.db"
    return run


def test_a_key_for_a_project_is_listed_with_it_and_one_out_of_the_projects_rules_is_refused_exit_4(projects_board):
    """root's key is for R (its only project) with R's class; key list shows a PROJECT column. A key for S (not a
    member) or of a class R may not use is refused: exit 4, one line naming the rule, nothing written.
    Wrong versions: exit 2 for a rule's refusal, a traceback, a key written before the check."""
    for args, says in ((("--project", "S"), "root is not a member of project S (members: someone-else); their"
                                            " projects: R"),
                       (("--class", "online"), "project R may not use class online (project S may); its classes are"
                                               " experiment")):
        refused = projects_board("key", "new", *args)
        assert refused.returncode == 4 and refused.stderr.count("\n") == 1 and says in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    if projects_board.db.exists():
        assert sqlite3.connect(projects_board.db).execute("SELECT COUNT(*) FROM api_keys").fetchone()[0] == 0
    made = projects_board("key", "new")
    assert made.returncode == 0 and ", project R, class experiment," in made.stdout, made.stderr
    header, row = projects_board("key", "list").stdout.splitlines()[:2]
    assert header.split()[:4] == ["ID", "FINGERPRINT", "USER", "PROJECT"] and row.split()[3] == "R"
    assert json.loads(projects_board("key", "list", "--json").stdout)[0]["project"] == "R"
