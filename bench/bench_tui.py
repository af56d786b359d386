"""The board TUI's costs, printed (no pass/fail):

1. One timeline refresh with 64 cards and 5,000 bookings in the window: rebuilding the grid
   and every line's Strip, and the same followed by a full repaint in a headless app.
   Target: under 100 ms.
2. Idle CPU over 60 s and peak RSS of `board --demo` (8 simulated cards, 1 s refresh, the service
   in process) and of a minimal Textual app (Header, Footer, a 1 s clock), run side by side in the
   same run, each in its own pseudo-terminal at 120x40. Targets: at most 2x its CPU and 40 MB more RSS.
   As root, a third one beside them: `board` as alice on the shared service's socket (a throwaway
   agent run as the unit runs it, bench/shared_install.py; the board neither reads NVML nor polls
   SQLite, the agent pushes). Target (issue 8, section 6): idle CPU at most 1.5x the minimal
   app's. The agent's own CPU over the same time is printed beside it.
3. First paint (--paint N): `board` in file mode (a private database, the simulated fleet) and the minimal app,
   each started in a fresh tmux session at 80x24, interleaved, N rounds each: the seconds from starting the
   session until the screen shows card 7's row (the minimal app: its footer), and the CPU seconds the command had
   used by then (every thread; steadier on a busy machine). Target (issue 37): 1.5x the minimal
   app's median or less. The package's bytecode is compiled first (an install has it).

    [sudo] .venv/bin/python bench/bench_tui.py [--seconds 60] [--skip-idle] [--skip-timeline] [--no-socket]
    .venv/bin/python bench/bench_tui.py --paint 15 [--against /tmp/old]   # first paint only; and another checkout's
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import itertools
import os
import pty
import random
import re
import shlex
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

NOW = 1795966200  # Sunday 2026-11-29 15:30 UTC, as in the tests


# -- 1. the timeline -----------------------------------------------------------------------------


def fake_bookings(cards, start: int, end: int, total: int, seed: int = 7):
    """`total` non-overlapping bookings per card packed into [start, end), some of them multi-card."""
    from app.store.bookings import Booking

    rng = random.Random(seed)
    per_card = -(-total // len(cards))
    span = (end - start) // per_card
    bookings, next_id = [], 1
    for card in cards:
        t = start
        for _ in range(per_card):
            length = rng.randint(span // 3, span)
            bookings.append(Booking(
                id=next_id, user=rng.choice(["alice", "bob", "carol", "dave", "erin"]), uid=1001,
                cards=(card.index,), card_uuids=(card.uuid,), start=t, end=t + length,
                klass=rng.choice(["online", "batch", "finetune", "experiment"]), note="", status="booked",
            ))
            next_id += 1
            t += span
    return bookings


async def timeline_bench(rounds: int) -> dict[str, float]:
    from textual.app import App

    from app.gpu.simulated import SimulatedSource, parse_scenario
    from app.tui.widgets.timeline import Timeline

    cards = SimulatedSource(parse_scenario({"cards": {"count": 64}}), clock=lambda: NOW).read().cards

    class TimelineApp(App):
        def compose(self):
            yield Timeline("alice", NOW, id="timeline")

    app = TimelineApp()
    async with app.run_test(size=(200, 70)) as pilot:  # every one of the 64 rows on screen
        timeline = app.query_one(Timeline)
        timeline.set_cards(cards)
        bookings = fake_bookings(cards, timeline.model.view_start, timeline.model.view_end, 5000)
        in_window = [b for b in bookings if b.end > timeline.model.view_start and b.start < timeline.model.view_end]
        assert len(in_window) >= 5000, len(in_window)
        await pilot.pause()
        compute, painted = [], []
        for n in range(rounds):
            shuffled = bookings[n % 2:] + bookings[: n % 2]  # a new tuple each round, as a reload gives
            t0 = time.perf_counter()
            timeline.set_bookings(shuffled)
            for y in range(timeline.size.height):
                timeline.render_line(y)
            compute.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            timeline.set_bookings(shuffled)
            await pilot.pause()  # the refresh, the compositor and the (headless) driver
            painted.append(time.perf_counter() - t0)
    return {
        "bookings": len(in_window),
        "compute_median_ms": statistics.median(compute) * 1000,
        "compute_max_ms": max(compute) * 1000,
        "painted_median_ms": statistics.median(painted) * 1000,
        "painted_max_ms": max(painted) * 1000,
    }


# -- 2. idle CPU and RSS -------------------------------------------------------------------------


class Pty:
    """A process on its own pseudo-terminal, its output drained so that it never blocks on writing."""

    def __init__(self, argv: list[str], env: dict[str, str], size: tuple[int, int] = (120, 40)) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
        self.process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=REPO,
                                        start_new_session=True, close_fds=True)
        os.close(slave)
        self.master = master
        self.bytes = 0
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.bytes += len(data)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
        os.close(self.master)


def idle_bench(seconds: float, warmup: float, install=None) -> dict[str, dict[str, float]]:
    import psutil

    tmp = tempfile.mkdtemp(prefix="bench-tui-")
    env = {**os.environ, "TERM": "xterm-256color", "COLORTERM": "truecolor", "XDG_STATE_HOME": tmp,
           "BOARD_DB": f"{tmp}/board.db"}
    env.pop("BOARD_SIMULATE", None)
    runs = {
        "board --demo": Pty([sys.executable, "-m", "app", "--demo"], env),
        "minimal app": Pty([sys.executable, str(REPO / "bench" / "minimal_app.py")], env),
    }
    if install is not None:  # `board` as a member, on the socket: what a shared install's user runs
        from shared_install import BOARD, as_user

        runs["board (socket)"] = Pty(as_user("alice", [str(BOARD)]), {
            **install.environ("alice"), "TERM": "xterm-256color", "COLORTERM": "truecolor"})
        procs_agent = psutil.Process(install.agent_pid)
    procs = {name: psutil.Process(run.process.pid) for name, run in runs.items()}
    peak = dict.fromkeys(runs, 0)
    try:
        deadline = time.monotonic() + warmup
        while time.monotonic() < deadline:
            for name, proc in procs.items():
                peak[name] = max(peak[name], proc.memory_info().rss)
            time.sleep(0.2)
        for name, run in runs.items():
            if run.process.poll() is not None:
                raise SystemExit(f"{name} exited early with {run.process.returncode}")
        cpu0 = {name: sum(proc.cpu_times()[:2]) for name, proc in procs.items()}
        agent0 = sum(procs_agent.cpu_times()[:2]) if install is not None else 0.0
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            for name, proc in procs.items():
                peak[name] = max(peak[name], proc.memory_info().rss)
            time.sleep(0.5)
        wall = time.monotonic() - t0
        cpu = {name: sum(proc.cpu_times()[:2]) - cpu0[name] for name, proc in procs.items()}
        if install is not None:
            cpu["agent"] = sum(procs_agent.cpu_times()[:2]) - agent0
    finally:
        for run in runs.values():
            run.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    figures = {name: {"cpu_pct": 100 * cpu[name] / wall, "peak_rss_mb": peak[name] / 2**20,
                      "output_kb": runs[name].bytes / 1024} for name in runs}
    if install is not None:
        figures["agent"] = {"cpu_pct": 100 * cpu["agent"] / wall, "peak_rss_mb": procs_agent.memory_info().rss / 2**20,
                            "output_kb": 0.0}
    return figures


# -- 3. first paint -------------------------------------------------------------------------------

_SESSIONS = itertools.count()
CARD_7_ROW = re.compile(r"^ 7 +[A-Z]", re.MULTILINE)  # the card table's row (the timeline's row starts at column 0)


def cpu_seconds(pid: int) -> float:
    """CPU time so far of process `pid`, every thread (/proc/PID/task/TID/schedstat: ns); 0 once it is gone."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            total += int((task / "schedstat").read_text().split()[0])
    except (OSError, ValueError):
        pass
    return total / 1e9


def first_paint(argv: list[str], env: dict[str, str], painted: Callable[[str], bool],
                timeout: float = 30.0) -> tuple[float, float]:
    """Seconds from starting `argv` in a new 80x24 tmux session (a server of its own) until `painted(screen)`,
    and the CPU seconds the command had used by then (steadier than the wall clock on a busy machine)."""
    server = f"bench-paint-{os.getpid()}-{next(_SESSIONS)}"  # a fresh server each time: none still shutting down
    tmux = ["tmux", "-L", server]
    command = " ".join(shlex.quote(word) for word in ["env", *(f"{k}={v}" for k, v in env.items()), *argv])
    began = time.perf_counter()
    started = subprocess.run([*tmux, "new-session", "-d", "-s", "paint", "-x", "80", "-y", "24", command],
                             capture_output=True, text=True)
    if started.returncode != 0:
        raise SystemExit(f"tmux new-session failed: {started.stderr.strip()}")
    # The pane's process is the command itself (env execs it): its CPU is read before each look at the screen, and
    # the reading before the look that shows the paint is the figure (the screen's look itself takes a while).
    pane = subprocess.run([*tmux, "display-message", "-p", "-t", "paint", "#{pane_pid}"],
                          capture_output=True, text=True).stdout
    try:
        while time.perf_counter() - began < timeout:
            cpu = cpu_seconds(int(pane))
            screen = subprocess.run([*tmux, "capture-pane", "-p", "-t", "paint"], capture_output=True, text=True).stdout
            if painted(screen):
                return time.perf_counter() - began, cpu
            time.sleep(0.005)
        raise SystemExit(f"{argv[-1]} painted nothing recognisable in {timeout:g} s:\n{screen}")
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)


def paint_bench(rounds: int, against: Path | None = None) -> dict[str, list[tuple[float, float]]]:
    for checkout in (REPO, *([against] if against else [])):
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(checkout / "app")], check=True,
                       stdout=subprocess.DEVNULL)
    tmp = tempfile.mkdtemp(prefix="bench-paint-")
    env = {"TERM": "xterm-256color", "COLORTERM": "truecolor", "XDG_STATE_HOME": tmp, "BOARD_DB": f"{tmp}/board.db",
           "BOARD_SIMULATE": "1", "TZ": "UTC", "HOME": tmp, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    board = str(Path(sys.executable).parent / "board")
    subprocess.run([board, "status"], env={**os.environ, **env}, check=True, stdout=subprocess.DEVNULL)  # migrate once
    cases = {
        "minimal app": ([sys.executable, str(REPO / "bench" / "minimal_app.py")], lambda screen: "Quit" in screen),
        "board (file mode)": ([board], lambda screen: CARD_7_ROW.search(screen) is not None),
    }
    if against is not None:  # the other checkout's board (its own venv), on the same database
        cases["against: board (file mode)"] = ([str(against / ".venv" / "bin" / "board")], cases["board (file mode)"][1])
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    try:
        for _ in range(rounds):
            for name, (argv, painted) in cases.items():  # interleaved, so machine noise hits both alike
                times[name].append(first_paint(argv, env, painted))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="idle measurement (default 60)")
    parser.add_argument("--warmup", type=float, default=8.0, help="start-up to skip before measuring CPU")
    parser.add_argument("--rounds", type=int, default=20, help="timeline refreshes to time")
    parser.add_argument("--skip-idle", action="store_true")
    parser.add_argument("--skip-timeline", action="store_true")
    parser.add_argument("--no-socket", action="store_true", help="leave out the board on the socket (root only)")
    parser.add_argument("--paint", type=int, metavar="ROUNDS", help="first paint in tmux at 80x24 only, ROUNDS each")
    parser.add_argument("--against", type=Path, help="--paint: another checkout's board beside this one's (its venv)")
    args = parser.parse_args()
    if args.paint:
        times = paint_bench(args.paint, args.against)
        print(f"first paint at 80x24 in tmux, {args.paint} rounds each, interleaved (wall clock; CPU used by then):")
        for which, label in ((0, "wall"), (1, "CPU ")):
            base = statistics.median(run[which] for run in times["minimal app"])
            for name, runs in times.items():
                values = [run[which] for run in runs]
                quartiles = statistics.quantiles(values, n=4)
                print(f"  {label} {name:<26} median {statistics.median(values):.3f} s"
                      f"  IQR {quartiles[0]:.3f}-{quartiles[2]:.3f} s  min {min(values):.3f} s"
                      f"  {statistics.median(values) / base:.2f}x")
        return

    os.environ["TZ"] = "UTC"
    time.tzset()
    if not args.skip_timeline:
        t = asyncio.run(timeline_bench(args.rounds))
        print(f"timeline, 64 cards x {t['bookings']} bookings in the window ({args.rounds} refreshes):")
        print(f"  rebuild + every line: median {t['compute_median_ms']:.1f} ms, max {t['compute_max_ms']:.1f} ms"
              f"  (target < 100 ms)")
        print(f"  with a full headless repaint: median {t['painted_median_ms']:.1f} ms, max {t['painted_max_ms']:.1f} ms")
    if args.skip_idle:
        return
    socket = not args.no_socket and os.geteuid() == 0
    print(f"idle, side by side for {args.seconds:.0f} s after {args.warmup:.0f} s of start-up, 120x40 ptys"
          + ("" if socket else " (the board on the socket needs root: left out)") + ":")
    if socket:
        from shared_install import shared_install

        with shared_install() as install:
            install.run("alice", "status", check=True)  # opens the database
            idle = idle_bench(args.seconds, args.warmup, install)
    else:
        idle = idle_bench(args.seconds, args.warmup)
    for name, figures in idle.items():
        print(f"  {name:<15} CPU {figures['cpu_pct']:5.2f} %   peak RSS {figures['peak_rss_mb']:6.1f} MB"
              f"   output {figures['output_kb']:.0f} KiB")
    base = idle["minimal app"]
    for name, target in (("board --demo", 2.0), ("board (socket)", 1.5)):
        if name not in idle:
            continue
        board = idle[name]
        ratio = board["cpu_pct"] / base["cpu_pct"] if base["cpu_pct"] else float("inf")
        print(f"  {name} / minimal: CPU x{ratio:.2f} (target <= {target:g}: {'met' if ratio <= target else 'NOT met'}),"
              f" RSS +{board['peak_rss_mb'] - base['peak_rss_mb']:.1f} MB (target <= 40 MB)")
    if "agent" in idle:
        print("  (the agent's CPU is the service's, shared by every open board; RSS for it is the end value)")


if __name__ == "__main__":
    main()
