"""Mutation testing of what only PostgreSQL's tests reach, against the `postgresql` tier (`make mutation` runs it last).

The rules' run (scripts/mutation_report.py) leaves out the `postgresql` tier, the only tests that reach the store's
advisory locks and the heartbeat's PostgreSQL side. Each run in RUNS copies the project to its own mutants-*/ with
pyproject's [tool.mutmut] narrowed to its functions and their tests, runs mutmut there on those functions' mutants
only, and scores them as the rules' run does: a survivor is caught, explained in tests/MUTANTS.md, or the run fails.
The functions' text and score go to tests/mutation-record.json under the run's key, and the next run skips them
until that text changes (`--all`: run anyway). Needs root and Debian's postgresql (a throwaway cluster per mutant).
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutation_report import REPO, entry, explained, percent, results, tally, write_record  # noqa: E402

# the audit chain's append takes its lock through chain_lock (sent with the COMMIT): only PostgreSQL tests can see it
# skip that
LOCKING = {"app/store/db.py": ("_write_pg", "chain_lock", "_lock", "_locking"), "app/store/pg.py": ("lock_keys", "_key"),
           "app/store/events.py": ("record", "_append_pg")}
# the locking's tests, SQLite's group commit (the same write() and audit append, where no lock is taken) and the
# store's own tests (the chain's links, on both stores)
TESTS = ("tests/unit/test_pg_store.py", "tests/unit/test_pg_fleet_speed.py", "tests/unit/test_pg_round_trips.py",
         "tests/unit/test_group_commit.py", "tests/unit/test_store.py")
RECORD_KEY = "app/store: PostgreSQL locking"
COPIED = ("app", "tests", "pyproject.toml")


class Run(NamedTuple):
    """One run: the functions it mutates (module -> names; module-level functions), the tests that reach them, the
    key its record goes under, and the copy of the project mutmut runs in (under the repository)."""

    name: str
    functions: dict[str, tuple[str, ...]]
    tests: tuple[str, ...]
    record_key: str
    work: str


RUNS = (
    Run("locking", LOCKING, TESTS, RECORD_KEY, "mutants-locks"),
    # The fleet's heartbeat: its beat writes without the store's lock (`own`), and on PostgreSQL leaves waking the
    # boards to the change feed; SQLite ignores the one and follows the chain's tail. The rest of app/service/fleet/hosts.py
    # is the rules' run's (on SQLite); these functions' mutants run here on both tiers.
    Run("hosts", {"app/service/fleet/hosts.py": ("beat", "start_heartbeat")}, ("tests/service/test_fleet.py",),
        "app/service/fleet/hosts: the heartbeat on PostgreSQL", "mutants-pg-hosts"),
)


def source(repo: Path, run: Run = RUNS[0]) -> str:
    """The run's functions' text, in its table's order: what the record's hash covers."""
    parts = []
    for module, names in run.functions.items():
        text = (repo / module).read_text()
        functions = {node.name: node for node in ast.walk(ast.parse(text)) if isinstance(node, ast.FunctionDef)}
        missing = [name for name in names if name not in functions]
        if missing:
            raise SystemExit(f"{module} has no {', '.join(missing)}: update RUNS in {Path(__file__).name}")
        parts += [ast.get_source_segment(text, functions[name]) for name in names]
    return "\n".join(parts)


def patterns(run: Run = RUNS[0]) -> list[str]:
    """mutmut's names for the run's functions' mutants (module-level functions: app.x.y.x_name__mutmut_N)."""
    return [f"{module[:-3].replace('/', '.')}.x_{name}__mutmut_*" for module, names in run.functions.items()
            for name in names]


def narrowed(pyproject: str, run: Run = RUNS[0]) -> str:
    """pyproject.toml with [tool.mutmut] replaced: the run's modules, its tests, and the rules' run's tiers but with
    the `postgresql` tier on."""
    rules_args = tomllib.loads(pyproject)["tool"]["mutmut"]["pytest_add_cli_args"]
    marks = rules_args[rules_args.index("-m") + 1].replace(" and not postgresql", "")
    section = ("[tool.mutmut]\n"
               f"source_paths = [\"app\"]\nonly_mutate = {json.dumps(list(run.functions))}\n"
               f"pytest_add_cli_args_test_selection = {json.dumps(list(run.tests))}\n"
               f"pytest_add_cli_args = {json.dumps(['-p', 'no:cacheprovider', '-m', marks])}\n")
    return re.sub(r"^\[tool\.mutmut\]\n(?:(?!^\[).*\n)*", section, pyproject, count=1, flags=re.MULTILINE)


def prepare(repo: Path, work: Path, run: Run = RUNS[0]) -> None:
    """A copy of the project for mutmut to mutate; mutmut's own mutants/ inside it is kept between runs."""
    work.mkdir(exist_ok=True)
    for name in COPIED:
        target = work / name
        if target.is_dir():
            shutil.rmtree(target)
        if (repo / name).is_dir():
            shutil.copytree(repo / name, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            target.write_text(narrowed((repo / name).read_text(), run))


def score(work: Path, explained_path: Path, run: Run = RUNS[0]) -> tuple[Counter, list[tuple[str, str]]]:
    """The run's functions' mutants as mutmut left them in work/mutants (the other functions' are generated, not run)."""
    wanted = patterns(run)
    codes = {name: code for found in results(work / "mutants").values() for name, code in found.items()
             if any(fnmatch.fnmatch(name, p) for p in wanted)}
    return tally(codes, explained(explained_path))


def one_run(run: Run, work: Path, args: argparse.Namespace, record: dict) -> int:
    """Mutate and score one run's functions (or skip them, as recorded); its record goes into `record`."""
    sha = hashlib.sha256(source(REPO, run).encode()).hexdigest()[:16]
    last_run = work / "locking.json"  # the functions' hash when this copy was last run
    mutmut = Path(sys.executable).with_name("mutmut")
    if args.score:
        if not last_run.exists() or json.loads(last_run.read_text())["sha256"] != sha:
            print(f"{work.name}/ was not run on the functions as they are now; run without --score", file=sys.stderr)
            return 2
    elif not args.all and record.get(run.record_key, {}).get("sha256") == sha:
        print(f"{run.name}: the functions are as {args.record.name} recorded them: nothing to mutate", file=sys.stderr)
        return 0
    elif os.geteuid() != 0:
        print(f"the {run.name} mutation run needs root (its tests start a throwaway PostgreSQL cluster as user"
              " postgres); run it as root", file=sys.stderr)
        return 2
    else:
        prepare(REPO, work, run)
        print(f"mutating against PostgreSQL ({run.name}): "
              f"{', '.join(n for names in run.functions.values() for n in names)}", file=sys.stderr)
        last_run.unlink(missing_ok=True)
        if subprocess.run([str(mutmut), "run", "--max-children", str(args.max_children), *patterns(run)],
                          cwd=work, check=False).returncode == 0:
            last_run.write_text(json.dumps({"sha256": sha}))
    counts, unexplained = score(work, REPO / "tests" / "MUTANTS.md", run)
    print(f"{run.name}: {counts['mutants']} mutants, {counts['caught']} caught, {counts['equivalent']} equivalent,"
          f" {percent(counts):.1f}%")
    if unexplained or not counts["mutants"]:
        print(f"\n{len(unexplained)} mutant(s) neither caught nor explained in MUTANTS.md"
              f" (`cd {work} && {mutmut} show NAME`):")
        for name, status in unexplained:
            print(f"  {status:12} {name}")
        return 1
    record[run.record_key] = {"sha256": sha, **entry(counts), "run": datetime.now(UTC).date().isoformat()}
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", choices=[run.name for run in RUNS], action="append",
                        help="only this run (repeatable; default: every run in RUNS)")
    parser.add_argument("--all", action="store_true", help="run even when the functions are as recorded")
    parser.add_argument("--score", action="store_true",
                        help="score the last run again without running mutmut (after explaining survivors)")
    parser.add_argument("--max-children", type=int, default=2, help="mutmut's parallel children (default 2)")
    parser.add_argument("--work", type=Path, help="the copy mutmut runs in (one --run only; default: the run's own)")
    parser.add_argument("--record", type=Path, default=REPO / "tests" / "mutation-record.json")
    args = parser.parse_args(argv)
    chosen = [run for run in RUNS if args.run is None or run.name in args.run]
    if args.work is not None and len(chosen) != 1:
        parser.error("--work needs a single --run")
    record = json.loads(args.record.read_text()) if args.record.exists() else {}
    worst = 0
    for run in chosen:
        worst = max(worst, one_run(run, args.work or REPO / run.work, args, record))
    if record != (json.loads(args.record.read_text()) if args.record.exists() else {}):
        write_record(args.record, record)
        print(f"recorded in {args.record.relative_to(REPO)}")
    return worst


if __name__ == "__main__":
    sys.exit(main())
