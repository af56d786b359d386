"""scripts/mutation_report.py: `make mutation` runs only what changed since its last clean run, and fails on a
survivor that tests/MUTANTS.md does not explain."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("mutation_report", REPO / "scripts" / "mutation_report.py")
mutation_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mutation_report)


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.mutmut]\nsource_paths = ["app"]\nonly_mutate = ["app/core/*", "app/rule.py"]\n')
    (tmp_path / "app" / "core").mkdir(parents=True)
    (tmp_path / "app" / "core" / "a.py").write_text("def a():\n    return 1\n")
    (tmp_path / "app" / "core" / "__init__.py").write_text('"""No functions: no mutants."""\n')
    (tmp_path / "app" / "rule.py").write_text("class R:\n    def r(self):\n        return 2\n")
    (tmp_path / "app" / "other.py").write_text("def o():\n    return 3\n")
    (tmp_path / "tests").mkdir()
    return tmp_path


def run(repo: Path, *argv: str) -> int:
    return mutation_report.main(["--repo", str(repo), "--mutants", str(repo / "mutants"),
                                 "--explained", str(repo / "tests" / "MUTANTS.md"),
                                 "--record", str(repo / "tests" / "mutation-record.json"), *argv])


def mutmut_left(repo: Path, module: str, codes: dict) -> None:
    """What `mutmut run` leaves: mutants/<module>.meta with each mutant's exit code."""
    meta = repo / "mutants" / (module + ".meta")
    meta.parent.mkdir(parents=True, exist_ok=True)
    meta.write_text(json.dumps({"exit_code_by_key": codes}))


def test_only_modules_changed_since_the_last_clean_run_are_mutated(repo, capsys):
    assert run(repo, "--select") == 0
    assert capsys.readouterr().out.split() == ["app.core.a.x_*", "app.core.a.xǁ*", "app.rule.x_*", "app.rule.xǁ*"]
    mutmut_left(repo, "app/core/a.py", {"app.core.a.x_a__mutmut_1": 1})
    mutmut_left(repo, "app/rule.py", {"app.rule.xǁRǁr__mutmut_1": 1, "app.rule.xǁRǁr__mutmut_2": 3})
    assert run(repo) == 0
    record = json.loads((repo / "tests" / "mutation-record.json").read_text())
    assert set(record) == {"app/core/a.py", "app/rule.py"}
    assert record["app/rule.py"]["mutants"] == 2 and record["app/rule.py"]["score"] == 100.0

    capsys.readouterr()
    assert run(repo, "--select") == 0
    assert capsys.readouterr().out.split() == [], "nothing changed, nothing to mutate"
    (repo / "app" / "rule.py").write_text("class R:\n    def r(self):\n        return 4\n")
    assert run(repo, "--select") == 0
    assert capsys.readouterr().out.split() == ["app.rule.x_*", "app.rule.xǁ*"]
    assert run(repo, "--select", "--all") == 0
    assert len(capsys.readouterr().out.split()) == 4
    assert run(repo, "--select", "app/core/*") == 0
    assert capsys.readouterr().out.split() == ["app.core.a.x_*", "app.core.a.xǁ*"], "named: changed or not"


def test_an_unexplained_survivor_fails_the_run_and_is_not_recorded(repo, capsys):
    assert run(repo, "--select", "app/rule.py") == 0
    mutmut_left(repo, "app/rule.py", {"app.rule.xǁRǁr__mutmut_1": 1, "app.rule.xǁRǁr__mutmut_2": 0})
    assert run(repo) == 1
    assert "mutmut show app.rule.xǁRǁr__mutmut_2" in capsys.readouterr().out
    assert not (repo / "tests" / "mutation-record.json").exists()

    (repo / "tests" / "MUTANTS.md").write_text("- `app.rule.xǁRǁr__mutmut_2`: why nothing observable changes.\n")
    assert run(repo) == 0
    record = json.loads((repo / "tests" / "mutation-record.json").read_text())
    assert record["app/rule.py"] | {"run": None} == {"sha256": mutation_report.digest(repo / "app" / "rule.py"),
                                                    "mutants": 2, "caught": 1, "equivalent": 1, "score": 100.0,
                                                    "run": None}


def test_a_mutant_left_unrun_is_not_a_catch(repo, capsys):
    assert run(repo, "--select", "app/rule.py") == 0
    mutmut_left(repo, "app/rule.py", {"app.rule.xǁRǁr__mutmut_1": None})
    mutmut_left(repo, "app/core/a.py", {"app.core.a.x_a__mutmut_1": None})  # generated, not selected: not counted
    assert run(repo) == 1
    out = capsys.readouterr().out
    assert "not checked" in out and "app.core.a" not in out


def test_a_module_unchanged_since_the_last_run_reruns_only_what_was_not_caught(repo, capsys):
    """A run stopped half way, or failed on survivors that new tests now kill: the next `make mutation` names only the
    mutants of that run not caught (mutmut would run every named one again); a changed module, or --all, starts over."""
    assert run(repo, "--select") == 0
    capsys.readouterr()
    mutmut_left(repo, "app/core/a.py", {"app.core.a.x_a__mutmut_1": 1, "app.core.a.x_a__mutmut_2": 0,
                                        "app.core.a.x_a__mutmut_3": None, "app.core.a.x_a__mutmut_4": 33})
    mutmut_left(repo, "app/rule.py", {"app.rule.xǁRǁr__mutmut_1": 1})
    assert run(repo) == 1  # a survivor, a mutant not run and one no test reaches: nothing recorded
    capsys.readouterr()
    assert run(repo, "--select") == 0
    assert capsys.readouterr().out.split() == ["app.core.a.x_a__mutmut_2", "app.core.a.x_a__mutmut_3",
                                               "app.core.a.x_a__mutmut_4"]
    (repo / "app" / "core" / "a.py").write_text("def a():\n    return 5\n")
    assert run(repo, "--select") == 0
    assert capsys.readouterr().out.split() == ["app.core.a.x_*", "app.core.a.xǁ*"]
    assert run(repo, "--select", "--all") == 0
    assert capsys.readouterr().out.split() == ["app.core.a.x_*", "app.core.a.xǁ*", "app.rule.x_*", "app.rule.xǁ*"]


_spec = importlib.util.spec_from_file_location("mutation_locks", REPO / "scripts" / "mutation_locks.py")
mutation_locks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mutation_locks)


def test_the_locking_run_narrows_only_mutmuts_section_and_turns_the_postgresql_tier_on():
    import tomllib

    ours = tomllib.loads((REPO / "pyproject.toml").read_text())
    narrowed = tomllib.loads(mutation_locks.narrowed((REPO / "pyproject.toml").read_text()))
    config = narrowed["tool"].pop("mutmut")
    assert config["only_mutate"] == ["app/store/db.py", "app/store/pg.py", "app/store/events.py"]
    assert config["pytest_add_cli_args_test_selection"] == list(mutation_locks.TESTS)
    marks = config["pytest_add_cli_args"][config["pytest_add_cli_args"].index("-m") + 1]
    assert "postgresql" not in marks and "slow" in marks
    del ours["tool"]["mutmut"]
    assert narrowed == ours, "every other section as it was"


def test_the_heartbeats_run_mutates_its_two_functions_against_the_fleets_tests_under_a_key_of_its_own():
    """Fails on: the run's table ignored (the locking's modules or tests narrowed in), or its record under the
    locking's key."""
    import tomllib

    hosts = next(run for run in mutation_locks.RUNS if run.name == "hosts")
    config = tomllib.loads(mutation_locks.narrowed((REPO / "pyproject.toml").read_text(), hosts))["tool"]["mutmut"]
    assert config["only_mutate"] == ["app/service/fleet/hosts.py"]
    assert config["pytest_add_cli_args_test_selection"] == ["tests/service/test_fleet.py"]
    assert mutation_locks.patterns(hosts) == ["app.service.fleet.hosts.x_beat__mutmut_*",
                                              "app.service.fleet.hosts.x_start_heartbeat__mutmut_*"]
    assert "def start_heartbeat(" in mutation_locks.source(REPO, hosts)
    assert len({run.record_key for run in mutation_locks.RUNS}) == len({run.work for run in mutation_locks.RUNS}) \
        == len(mutation_locks.RUNS)


def test_one_copy_named_for_several_runs_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        mutation_locks.main(["--score", "--work", str(tmp_path)])
    assert "--work needs a single --run" in capsys.readouterr().err


def test_the_locking_run_counts_only_the_locking_functions_mutants(tmp_path):
    meta = tmp_path / "mutants" / "app" / "store" / "db.py.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": {
        "app.store.db.x__write_pg__mutmut_1": 1, "app.store.db.x__write_pg__mutmut_2": 0,
        "app.store.db.x_chain_lock__mutmut_1": 0, "app.store.db.x__lock__mutmut_1": None,
        "app.store.db.x_connect__mutmut_1": 0}}))  # generated, not a locking function's: not counted
    explained = tmp_path / "MUTANTS.md"
    explained.write_text("- `app.store.db.x_chain_lock__mutmut_1`: why nothing observable changes.\n")
    counts, unexplained = mutation_locks.score(tmp_path, explained)
    assert (counts["mutants"], counts["caught"], counts["equivalent"]) == (4, 1, 1)
    assert unexplained == [("app.store.db.x__write_pg__mutmut_2", "survived"),
                           ("app.store.db.x__lock__mutmut_1", "not checked")]


def test_scoring_again_refuses_a_run_made_on_other_functions(tmp_path, capsys):
    record = tmp_path / "record.json"
    (tmp_path / "locking.json").write_text(json.dumps({"sha256": "not these functions"}))
    assert mutation_locks.main(["--score", "--run", "locking", "--work", str(tmp_path), "--record", str(record)]) == 2
    assert "was not run on the functions as they are now" in capsys.readouterr().err
    assert not record.exists()


def test_the_rules_report_keeps_the_locking_runs_record(repo, capsys):
    record = repo / "tests" / "mutation-record.json"
    record.write_text(json.dumps({mutation_locks.RECORD_KEY: {"score": 100.0}, "app/gone.py": {"score": 100.0}}))
    assert run(repo, "--select", "app/rule.py") == 0
    mutmut_left(repo, "app/rule.py", {"app.rule.xǁRǁr__mutmut_1": 1})
    assert run(repo) == 0
    assert set(json.loads(record.read_text())) == {mutation_locks.RECORD_KEY, "app/rule.py"}, "a module gone leaves"
