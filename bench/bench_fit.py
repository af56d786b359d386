"""`board fit` wall time (issue 10, section 5) on a ~100 MB GGUF ("mid") and on a GGUF with a 100,000-token vocabulary
("wide-vocab"), against `python3 -c "import gguf"` with the same interpreter (the venv's), run side by side
(interleaved, so machine noise hits every case alike). Medians; the ratio is against that baseline. The issue's
target: reading a model's header takes well under a second whatever its size.

    .venv/bin/python bench/bench_fit.py [--runs 10] [--breakdown] [--profile]

--breakdown adds gguf's GGUFReader alone on each file (no board), to tell board's own time from the reader's.
--profile runs one `board fit` of wide-vocab under cProfile in this process and prints where the time goes.
The models are written with tests/fit/shapes.py into a temporary directory, off the clock.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fit.shapes import write_model  # noqa: E402

BIN = Path(sys.executable).parent
MODELS = ("mid", "wide-vocab")


def timed(argv: list[str], env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child: user + system)."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err, cwd=REPO)
        _, status, usage = os.wait4(child.pid, 0)
        elapsed = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(argv)} failed: {err.read().decode().strip()}")
    return elapsed, usage.ru_utime + usage.ru_stime


def report(wall: dict[str, list[float]], cpu: dict[str, list[float]]) -> None:
    base, base_cpu = statistics.median(next(iter(wall.values()))), statistics.median(next(iter(cpu.values())))
    print(f"{'case':52} {'median s':>8} {'min s':>7} {'max s':>7} {'ratio':>7}   {'CPU s':>6} {'ratio':>7}")
    for name, values in wall.items():
        median, cpu_median = statistics.median(values), statistics.median(cpu[name])
        flag = "" if not name.startswith("board") else ("  ok" if median < 1.0 else "  OVER 1 s")
        print(f"{name:52} {median:8.3f} {min(values):7.3f} {max(values):7.3f} {median / base:6.2f}x"
              f"   {cpu_median:6.3f} {cpu_median / base_cpu:6.2f}x{flag}")
    print("target (issue 10): well under a second; CPU is user + system of the child, steadier on a shared machine")


def profile(path: Path) -> None:
    import cProfile
    import io
    import pstats

    from app.cli import main

    profiler = cProfile.Profile()
    with open(os.devnull, "w") as sink:
        stdout, sys.stdout = sys.stdout, sink
        try:
            profiler.runcall(main, ["fit", str(path)])
        finally:
            sys.stdout = stdout
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(25)
    print(f"\ncProfile of `board fit {path.name}` in process (cumulative, top 25):")
    print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--breakdown", action="store_true", help="also time gguf's GGUFReader alone on each file")
    parser.add_argument("--profile", action="store_true", help="profile one `board fit` of wide-vocab")
    args = parser.parse_args()
    board = BIN / "board"
    if not board.exists():
        raise SystemExit(f"no {board}: run this with the venv's python (make builds .venv)")
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "app")], check=True, stdout=subprocess.DEVNULL)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BOARD_")}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: write_model(Path(tmp) / f"{name}.gguf", name) for name in MODELS}
        cases = {"baseline: python -c 'import gguf'": [sys.executable, "-c", "import gguf"]}
        for name, path in paths.items():
            cases[f"board fit {name}.gguf ({path.stat().st_size / 1e6:.0f} MB)"] = [str(board), "fit", str(path)]
        if args.breakdown:
            for name, path in paths.items():
                cases[f"  GGUFReader alone, {name}"] = [sys.executable, "-c", f"import gguf; gguf.GGUFReader({str(path)!r})"]
        for argv in cases.values():  # a first run of each, untimed: the page cache, the bytecode
            timed(argv, env)
        wall: dict[str, list[float]] = {name: [] for name in cases}
        cpu: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.runs):
            for name, argv in cases.items():  # interleaved
                elapsed, used = timed(argv, env)
                wall[name].append(elapsed)
                cpu[name].append(used)
        print(f"{args.runs} runs each, interleaved, {sys.executable}:")
        report(wall, cpu)
        if args.profile:
            profile(paths["wide-vocab"])


if __name__ == "__main__":
    main()
