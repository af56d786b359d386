"""Mutation testing of the rules: choose what `mutmut run` mutates, then score it (`make mutation` runs both).

`--select` starts a run: it lists the modules of pyproject's [tool.mutmut] only_mutate whose text differs
from tests/mutation-record.json (all of them with `--all`, or the MODULEs named), writes them with their hashes to
mutants/selection.json and prints the mutant-name patterns to give `mutmut run`. A module whose text is as the last
selection had it (a run stopped, or failed on survivors) gets the names of its mutants not caught yet instead, so the
next run takes up only those (with `--all`, everything again).

Without `--select` it scores what mutmut left in mutants/ for the selected modules. A mutant counts as caught
when a test failed or timed out on it. Mutants listed in tests/MUTANTS.md (`- name: why it is equivalent`)
leave the denominator; every other survivor is printed with its `mutmut show` command. Exits 1 when a module
scores under --target or a survivor is unexplained; otherwise records each module's hash and score in
tests/mutation-record.json, so that the next `make mutation` skips it until its text changes.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import hashlib
import json
import re
import sys
import time
import tomllib
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CAUGHT = {1: "killed", 3: "killed", 36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout",
          37: "caught by type check", -11: "killed", -9: "killed"}
MISSED = {0: "survived", 5: "no tests", 33: "no tests"}
EXPLAINED = re.compile(r"^- `([\w.ǁ]+__mutmut_\d+)`", re.MULTILINE)


def explained(path: Path) -> set[str]:
    return set(EXPLAINED.findall(path.read_text())) if path.exists() else set()


def results(mutants: Path) -> dict[str, dict[str, int | None]]:
    """{module path: {mutant name: exit code}} for every file mutmut mutated."""
    found = {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        if codes:
            found[str(meta.relative_to(mutants))[: -len(".meta")]] = codes
    return found


def tally(codes: dict[str, int | None], equivalent: set[str]) -> tuple[Counter, list[tuple[str, str]]]:
    """Count a run's mutants (caught, equivalent, missed, unrun) and list those neither caught nor explained."""
    counts: Counter = Counter(mutants=len(codes))
    unexplained = []
    for name, code in codes.items():
        if code in CAUGHT:
            counts["caught"] += 1
        elif name in equivalent:
            counts["equivalent"] += 1
        elif code in MISSED:
            counts["missed"] += 1
            unexplained.append((name, MISSED[code]))
        else:  # not run yet, interrupted, or suspicious: not a catch
            counts["unrun"] += 1
            unexplained.append((name, "not checked" if code is None else f"exit {code}"))
    return counts, unexplained


def percent(counts: Counter) -> float:
    """Caught out of the mutants that are not equivalent."""
    scored = counts["mutants"] - counts["equivalent"]
    return 100.0 * counts["caught"] / scored if scored else 100.0


def entry(counts: Counter) -> dict:
    """What the record keeps of a run, besides the text's hash and the date."""
    return {"mutants": counts["mutants"], "caught": counts["caught"], "equivalent": counts["equivalent"],
            "score": round(percent(counts), 1)}


def write_record(path: Path, record: dict) -> None:
    path.write_text(json.dumps(dict(sorted(record.items())), indent=1) + "\n")


def mutated_modules(repo: Path) -> list[str]:
    """The source files [tool.mutmut] only_mutate names, as mutmut matches them (fnmatch on the path)."""
    config = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["mutmut"]
    files = sorted(str(p.relative_to(repo)) for root in config["source_paths"] for p in (repo / root).rglob("*.py"))
    return [f for f in files if any(fnmatch.fnmatch(f, pattern) for pattern in config["only_mutate"])]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def has_functions(path: Path) -> bool:
    """mutmut mutates only inside functions: a module without any has no mutants."""
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) for node in ast.walk(ast.parse(path.read_text())))


def patterns(module: str) -> list[str]:
    """mutmut's names for a module's mutants: app.x.y.x_function__mutmut_N and app.x.y.xǁClassǁmethod__mutmut_N."""
    dotted = module[: -len(".py")].replace("/", ".").removesuffix(".__init__")
    return [f"{dotted}.x_*", f"{dotted}.xǁ*"]


def select(args: argparse.Namespace) -> int:
    record = json.loads(args.record.read_text()) if args.record.exists() else {}
    chosen = {}
    for module in mutated_modules(args.repo):
        path = args.repo / module
        if not has_functions(path):
            continue
        sha = digest(path)
        if args.only and not any(fnmatch.fnmatch(module, pattern) for pattern in args.only):
            continue
        if args.all or args.only or record.get(module, {}).get("sha256") != sha:
            chosen[module] = sha
    args.mutants.mkdir(exist_ok=True)
    selection_file = args.mutants / "selection.json"
    before = json.loads(selection_file.read_text())["modules"] if selection_file.exists() else {}
    left = results(args.mutants)
    # mutmut runs every mutant it is named again: a module unchanged since a run that did not end clean (stopped, or
    # failed on a survivor) names only its mutants not caught yet, so that a rerun after new tests costs only those
    def unfinished(module: str, sha: str) -> bool:
        return (not args.all and before.get(module) == sha and module in left
                and record.get(module, {}).get("sha256") != sha)

    names = {module: ([name for name, code in left[module].items() if code not in CAUGHT]
                      if unfinished(module, sha) else patterns(module))
             for module, sha in chosen.items()}
    selection_file.write_text(json.dumps({"started": time.time(), "modules": chosen}, indent=1))
    if not chosen:
        print(f"every module is as {args.record.relative_to(args.repo)} recorded it: nothing to mutate", file=sys.stderr)
    else:
        resumed = [module for module, named in names.items() if named != patterns(module)]
        print(f"mutating {len(chosen)} module(s): {', '.join(chosen)}"
              + (f"; of {', '.join(resumed)}, unchanged since the last run, only the mutants not caught yet"
                 if resumed else ""), file=sys.stderr)
    print(" ".join(name for named in names.values() for name in named))
    return 0


def report(args: argparse.Namespace) -> int:
    selection_file = args.mutants / "selection.json"
    if not selection_file.exists():
        print(f"no {selection_file}; run `make mutation`", file=sys.stderr)
        return 2
    selection = json.loads(selection_file.read_text())
    chosen: dict[str, str] = selection["modules"]
    if not chosen:
        return 0
    found = results(args.mutants)
    by_module = {module: found.get(module, {}) for module in chosen}
    names = {module: tuple(patterns(module)) for module in chosen}
    # every module's mutants are generated; only the selected ones were run
    by_module = {module: {name: code for name, code in codes.items()
                          if any(fnmatch.fnmatch(name, p) for p in names[module])}
                 for module, codes in by_module.items()}
    equivalent = explained(args.explained)
    unexplained: list[tuple[str, str]] = []
    failing = []
    totals: Counter = Counter()
    scores = {}
    print(f"{'module':34} {'mutants':>7} {'caught':>7} {'equiv.':>7} {'missed':>7} {'unrun':>6} {'score':>7}")
    for module, codes in by_module.items():
        counts, left = tally(codes, equivalent)
        unexplained += left
        totals.update(counts)
        score = percent(counts)
        scores[module] = entry(counts)
        if score < args.target:
            failing.append(module)
        print(f"{module:34} {counts['mutants']:7} {counts['caught']:7} {counts['equivalent']:7} {counts['missed']:7}"
              f" {counts['unrun']:6} {score:6.1f}%")
    print(f"{'all':34} {totals['mutants']:7} {totals['caught']:7} {totals['equivalent']:7} {totals['missed']:7}"
          f" {totals['unrun']:6} {percent(totals):6.1f}%")
    seconds = round(time.time() - selection["started"])
    print(f"{len(chosen)} module(s) in {seconds // 60} min {seconds % 60} s")
    if unexplained:
        print(f"\n{len(unexplained)} mutant(s) neither caught nor explained in {args.explained.name}:")
        for name, status in unexplained:
            print(f"  {status:12} .venv/bin/mutmut show {name}")
    run = {name for codes in by_module.values() for name in codes}
    caught_anyway = sorted(name for codes in by_module.values() for name, code in codes.items()
                           if name in equivalent and code in CAUGHT)
    # a line names a mutant that no longer exists only if its module was mutated this time
    gone = sorted(name for name in equivalent - run
                  if any(fnmatch.fnmatch(name, p) for module in chosen for p in names[module]))
    if caught_anyway or gone:  # the list must not rot: these lines no longer explain anything
        print(f"\n{len(caught_anyway) + len(gone)} line(s) of {args.explained.name} to remove:")
        for name in caught_anyway:
            print(f"  caught now   {name}")
        for name in gone:
            print(f"  no such mutant {name}")
    if failing:
        print(f"\nunder {args.target:g}%: {', '.join(failing)}")
    if failing or unexplained:
        return 1
    current = set(mutated_modules(args.repo))  # a module no longer mutated leaves the record (not other runs' keys)
    record = json.loads(args.record.read_text()) if args.record.exists() else {}
    record = {key: kept for key, kept in record.items() if key in current or not key.endswith(".py")}
    today = datetime.now(UTC).date().isoformat()
    for module, sha in chosen.items():
        record[module] = {"sha256": sha, **scores[module], "run": today}
    write_record(args.record, record)
    print(f"recorded in {args.record.relative_to(args.repo)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--select", action="store_true", help="start a run: choose the modules, print mutmut's patterns")
    parser.add_argument("--all", action="store_true", help="with --select: every module, changed or not")
    parser.add_argument("only", nargs="*", metavar="MODULE",
                        help="with --select: only these modules (paths or globs, such as app/fit/*), changed or not")
    parser.add_argument("--target", type=float, default=85.0, help="the least score per module, in %% (default 85)")
    parser.add_argument("--repo", type=Path, default=REPO, help=argparse.SUPPRESS)
    parser.add_argument("--mutants", type=Path, default=REPO / "mutants", help="mutmut's folder (default mutants/)")
    parser.add_argument("--explained", type=Path, default=REPO / "tests" / "MUTANTS.md")
    parser.add_argument("--record", type=Path, default=REPO / "tests" / "mutation-record.json")
    args = parser.parse_args(argv)
    return select(args) if args.select else report(args)


if __name__ == "__main__":
    sys.exit(main())
