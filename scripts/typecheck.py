"""The type checker against a baseline that may only shrink (`make check` and `make test` run it after ruff).

mypy checks app/ as pyproject's [tool.mypy] says. tests/mypy-baseline.txt holds the errors still to fix, one line
each and without line numbers (`path: [code] message`, sorted), so that an edit above an error does not churn it.
The check fails on:
- an error that the baseline does not hold (printed as mypy prints it): fix it;
- a line of the baseline that mypy no longer finds: run `.venv/bin/python scripts/typecheck.py --update`, so that
  the file always states what is left;
- any error in a package of ZERO_PACKAGES that the baseline holds nothing of, baseline or not.

`--update` rewrites the baseline and only ever removes lines. After a merge, `--update --allow-growth` may add lines,
never in a package of ZERO_PACKAGES already at 0 (a first baseline, where there is no file yet, takes every line).
A package of ZERO_PACKAGES that still has lines in the baseline is named on every run until it reaches 0; from then
on no error there passes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple

# Packages held at 0 errors: nothing of theirs may stay in (or come back to) the baseline.
ZERO_PACKAGES = ("app/core", "app/store", "app/gateway", "app/service")

REPO = Path(__file__).resolve().parent.parent
BASELINE = "tests/mypy-baseline.txt"


class Error(NamedTuple):
    path: str
    line: int
    code: str
    message: str

    @property
    def key(self) -> str:
        """The baseline's line: no line number."""
        return f"{self.path}: [{self.code}] {self.message}"

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: error: {self.message}  [{self.code}]"


def run_mypy(repo: Path) -> list[Error]:
    """mypy's errors (notes left out), run in `repo` with its configuration. Exits 2 when mypy itself fails."""
    done = subprocess.run([sys.executable, "-m", "mypy", "--output", "json"], cwd=repo,
                          capture_output=True, text=True)
    errors = []
    for line in done.stdout.splitlines():
        if not line.strip():  # a clean run prints one empty line
            continue
        try:
            found = json.loads(line)
        except ValueError:
            found = None
        if not isinstance(found, dict):  # a crash or a configuration error, not a finding
            sys.exit(f"mypy failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
        if found["severity"] == "error":
            errors.append(Error(found["file"], found["line"], found["code"] or "misc", found["message"]))
    if done.returncode not in (0, 1) or (done.returncode == 1 and not errors):
        sys.exit(f"mypy failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
    return errors


def read_baseline(path: Path) -> Counter[str]:
    if not path.exists():
        return Counter()
    return Counter(line for line in path.read_text().splitlines() if line.strip())


def package(key: str) -> str | None:
    """The package of ZERO_PACKAGES that holds a baseline line's file, if any."""
    return next((name for name in ZERO_PACKAGES if key.startswith(name + "/")), None)


def pending(baseline: Counter[str]) -> Counter[str]:
    """{package of ZERO_PACKAGES: its lines in the baseline} for those not at 0 yet."""
    waiting: Counter[str] = Counter()
    for key, count in baseline.items():
        if name := package(key):
            waiting[name] += count
    return waiting


def check(errors: list[Error], baseline: Counter[str], baseline_name: str) -> int:
    found = Counter(error.key for error in errors)
    waiting = pending(baseline)
    held = [error for error in errors if package(error.key) and package(error.key) not in waiting]
    new = found - baseline
    fixed = baseline - found
    failed = False
    if held:
        failed = True
        print("errors in a package held at 0 (ZERO_PACKAGES in scripts/typecheck.py); no baseline may hold them:")
        for error in held:
            print(f"  {error}")
    unheld_new = [error for error in errors if error.key in new and error not in held]
    if unheld_new:
        failed = True
        print(f"new mypy errors (not in {baseline_name}); fix them:")
        for error in unheld_new:
            also = baseline[error.key]
            print(f"  {error}" + (f"  ({also} like it in the baseline, {found[error.key]} now)" if also else ""))
    if fixed:
        failed = True
        print(f"fixed, but still in {baseline_name}; run .venv/bin/python scripts/typecheck.py --update to remove them:")
        for key in sorted(fixed.elements()):
            print(f"  {key}")
    if waiting:
        print("not at 0 yet (ZERO_PACKAGES): " + ", ".join(f"{name} {count}" for name, count in sorted(waiting.items())))
    if not failed:
        print(f"mypy: {len(errors)} errors, each in {baseline_name}" if errors else "mypy: 0 errors")
    return 1 if failed else 0


def update(errors: list[Error], baseline: Counter[str], path: Path, allow_growth: bool) -> int:
    found = Counter(error.key for error in errors)
    added = found - baseline
    if added and not allow_growth:
        print(f"--update only removes lines; these errors are not in {path.name} (fix them, or after a merge pass "
              "--allow-growth):")
        for error in errors:
            if error.key in added:
                print(f"  {error}")
        return 1
    # A first baseline (no file yet) holds every package where it stands.
    waiting = pending(found if not path.exists() else baseline)
    held = [error for error in errors if error.key in added and package(error.key) not in (None, *waiting)]
    if held:
        print("errors in a package held at 0 (ZERO_PACKAGES in scripts/typecheck.py); not added:")
        for error in held:
            print(f"  {error}")
        return 1
    path.write_text("".join(line + "\n" for line in sorted(found.elements())))
    removed = sum((baseline - found).values())
    print(f"{path.name}: {sum(found.values())} errors ({removed} removed, {sum(added.values())} added)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="rewrite the baseline: only removes lines")
    parser.add_argument("--allow-growth", action="store_true", help="with --update: let it add lines (after a merge)")
    parser.add_argument("--repo", type=Path, default=REPO, help="where mypy runs (its pyproject.toml)")
    parser.add_argument("--baseline", help=f"the baseline file, relative to --repo (default {BASELINE})",
                        default=BASELINE)
    args = parser.parse_args(argv)
    if args.allow_growth and not args.update:
        parser.error("--allow-growth goes with --update")
    path = args.repo / args.baseline
    errors = run_mypy(args.repo)
    baseline = read_baseline(path)
    if args.update:
        return update(errors, baseline, path, args.allow_growth)
    return check(errors, baseline, args.baseline)


if __name__ == "__main__":
    sys.exit(main())
