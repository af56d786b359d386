"""scripts/typecheck.py: the real mypy on a tiny package, against a baseline that may only shrink."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("typecheck", REPO / "scripts" / "typecheck.py")
typecheck = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(typecheck)

BAD = 'x: int = "a"\n'
ALSO_BAD = 'y: str = 1\n'
BAD_LINE = 'app/util.py: [assignment] Incompatible types in assignment (expression has type "str", variable has type "int")'


@pytest.fixture(scope="session")
def mypy_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("mypy-cache")


@pytest.fixture
def repo(tmp_path, mypy_cache, monkeypatch):
    """app/ with app/util.py and app/core/rule.py, both clean; mypy's cache shared by the session's tests."""
    monkeypatch.setenv("MYPY_CACHE_DIR", str(mypy_cache))
    (tmp_path / "pyproject.toml").write_text('[tool.mypy]\npackages = ["app"]\n')
    (tmp_path / "app" / "core").mkdir(parents=True)
    (tmp_path / "tests").mkdir()
    for name in ("__init__.py", "util.py", "core/__init__.py", "core/rule.py"):
        (tmp_path / "app" / name).write_text("")
    return tmp_path


def run(repo: Path, *argv: str) -> int:
    return typecheck.main(["--repo", str(repo), *argv])


def baseline(repo: Path) -> list[str]:
    return (repo / "tests" / "mypy-baseline.txt").read_text().splitlines()


def test_a_clean_tree_and_an_empty_baseline_pass(repo, capsys):
    """No error at all: mypy's JSON output is one empty line. Wrong version: that line read as a crash."""
    (repo / "tests" / "mypy-baseline.txt").write_text("")
    assert run(repo) == 0
    assert "mypy: 0 errors" in capsys.readouterr().out


def test_a_new_error_fails_as_mypy_prints_it(repo, capsys):
    """Wrong versions: errors matched with their line numbers (an edit above one churns the baseline), a new error
    passed because another one like it in another file is in the baseline, a count compared instead of the lines."""
    (repo / "app" / "util.py").write_text("\n" + BAD)  # line 2: the baseline's key has no line number
    (repo / "tests" / "mypy-baseline.txt").write_text(BAD_LINE + "\n")
    assert run(repo) == 0
    (repo / "app" / "other.py").write_text(BAD)  # the same message, another file
    assert run(repo) == 1
    out = capsys.readouterr().out
    assert ('  app/other.py:1: error: Incompatible types in assignment (expression has type "str", variable has '
            'type "int")  [assignment]') in out
    assert "app/util.py:2" not in out


def test_a_second_error_like_one_in_the_baseline_is_new(repo, capsys):
    """The baseline counts: one listed line does not cover two errors. Wrong version: compared as sets."""
    (repo / "app" / "util.py").write_text(BAD + BAD.replace("x", "z"))
    (repo / "tests" / "mypy-baseline.txt").write_text(BAD_LINE + "\n")
    assert run(repo) == 1
    assert "(1 like it in the baseline, 2 now)" in capsys.readouterr().out


def test_an_error_fixed_but_still_listed_fails_until_update_removes_it(repo, capsys):
    """Wrong versions: a fixed error let pass (the baseline would stop stating the truth); --update that keeps it."""
    (repo / "app" / "util.py").write_text(ALSO_BAD)
    (repo / "tests" / "mypy-baseline.txt").write_text(
        BAD_LINE + "\n" + 'app/util.py: [assignment] Incompatible types in assignment (expression has type "int", '
        'variable has type "str")\n')
    assert run(repo) == 1
    out = capsys.readouterr().out
    assert "fixed, but still in tests/mypy-baseline.txt" in out and "--update" in out
    assert f"  {BAD_LINE}\n" in out
    assert run(repo, "--update") == 0
    assert baseline(repo) == [
        'app/util.py: [assignment] Incompatible types in assignment (expression has type "int", variable has type "str")']
    assert run(repo) == 0


def test_update_refuses_to_add_lines_without_allow_growth(repo, capsys):
    """Wrong versions: --update that writes whatever mypy finds (the baseline could grow), or writes the removals
    while refusing the additions."""
    (repo / "app" / "util.py").write_text(ALSO_BAD)
    (repo / "tests" / "mypy-baseline.txt").write_text(BAD_LINE + "\n")
    assert run(repo, "--update") == 1
    assert "--allow-growth" in capsys.readouterr().out
    assert baseline(repo) == [BAD_LINE]
    assert run(repo, "--update", "--allow-growth") == 0
    assert baseline(repo) == [
        'app/util.py: [assignment] Incompatible types in assignment (expression has type "int", variable has type "str")']


def test_a_package_held_at_zero_fails_even_when_listed_or_grown_into(repo, capsys, monkeypatch):
    """ZERO_PACKAGES: once the baseline holds nothing of a package, no error there passes, and --allow-growth cannot
    list one. While the baseline still holds some (a first baseline takes them), the check names the package and its
    count.
    Wrong versions: the zero rule dropped (a listed error passes), applied to packages not at 0 yet (main fails
    today), --allow-growth that lists errors in a package at 0, a prefix match that takes app/corelib for app/core."""
    monkeypatch.setattr(typecheck, "ZERO_PACKAGES", ("app/core",))
    (repo / "app" / "core" / "rule.py").write_text(BAD)
    assert run(repo, "--update", "--allow-growth") == 0
    assert baseline(repo) == [BAD_LINE.replace("app/util.py", "app/core/rule.py")]
    assert run(repo) == 0
    assert "not at 0 yet (ZERO_PACKAGES): app/core 1" in capsys.readouterr().out

    (repo / "tests" / "mypy-baseline.txt").write_text("")
    assert run(repo, "--update", "--allow-growth") == 1
    assert "held at 0" in capsys.readouterr().out
    assert baseline(repo) == []
    assert run(repo) == 1
    out = capsys.readouterr().out
    assert "held at 0" in out and "app/core/rule.py:1: error:" in out

    (repo / "app" / "core" / "rule.py").write_text("")
    (repo / "app" / "corelib.py").write_text(BAD)
    assert run(repo, "--update", "--allow-growth") == 0
    assert baseline(repo) == [BAD_LINE.replace("app/util.py", "app/corelib.py")]
