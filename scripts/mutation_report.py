"""The mutation score per module, from the results `mutmut run` left in mutants/ (`make mutation` runs both).

A mutant counts as caught when a test failed or timed out on it. Mutants listed in tests/MUTANTS.md
(`- name: why it is equivalent`) leave the denominator; every other survivor is printed with its
`mutmut show` command. Exits 1 when a module scores under --target or a survivor is unexplained.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CAUGHT = {1: "killed", 3: "killed", 36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout", 255: "timeout",
          37: "caught by type check", -11: "killed", -9: "killed"}
MISSED = {0: "survived", 5: "no tests", 33: "no tests"}
EXPLAINED = re.compile(r"^- `([\w.]+__mutmut_\d+)`", re.MULTILINE)


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=float, default=85.0, help="the least score per module, in %% (default 85)")
    parser.add_argument("--mutants", type=Path, default=REPO / "mutants", help="mutmut's folder (default mutants/)")
    parser.add_argument("--explained", type=Path, default=REPO / "tests" / "MUTANTS.md")
    args = parser.parse_args(argv)

    by_module = results(args.mutants)
    if not by_module:
        print(f"no mutmut results in {args.mutants}; run `make mutation`", file=sys.stderr)
        return 2
    equivalent = explained(args.explained)
    unexplained: list[tuple[str, str]] = []
    failing = []
    totals: Counter = Counter()
    print(f"{'module':34} {'mutants':>7} {'caught':>7} {'equiv.':>7} {'missed':>7} {'unrun':>6} {'score':>7}")
    for module, codes in by_module.items():
        counts: Counter = Counter()
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
        counts["mutants"] = len(codes)
        totals.update(counts)
        scored = counts["mutants"] - counts["equivalent"]
        score = 100.0 * counts["caught"] / scored if scored else 100.0
        if score < args.target:
            failing.append(module)
        print(f"{module:34} {counts['mutants']:7} {counts['caught']:7} {counts['equivalent']:7} {counts['missed']:7}"
              f" {counts['unrun']:6} {score:6.1f}%")
    scored = totals["mutants"] - totals["equivalent"]
    print(f"{'all':34} {totals['mutants']:7} {totals['caught']:7} {totals['equivalent']:7} {totals['missed']:7}"
          f" {totals['unrun']:6} {100.0 * totals['caught'] / scored if scored else 100.0:6.1f}%")
    if unexplained:
        print(f"\n{len(unexplained)} mutant(s) neither caught nor explained in {args.explained.relative_to(REPO)}:")
        for name, status in unexplained:
            print(f"  {status:12} .venv/bin/mutmut show {name}")
    caught_anyway = sorted(name for codes in by_module.values() for name, code in codes.items()
                           if name in equivalent and code in CAUGHT)
    gone = sorted(equivalent - {name for codes in by_module.values() for name in codes})
    if caught_anyway or gone:  # the list must not rot: these lines no longer explain anything
        print(f"\n{len(caught_anyway) + len(gone)} line(s) of {args.explained.relative_to(REPO)} to remove:")
        for name in caught_anyway:
            print(f"  caught now   {name}")
        for name in gone:
            print(f"  no such mutant {name}")
    if failing:
        print(f"\nunder {args.target:g}%: {', '.join(failing)}")
    return 1 if failing or unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
