"""The shared service with boards open (issue 8, section 6), against a throwaway agent run as the unit runs it:

1. One GPU reader: the service's fleet reads per second (its `stats` operation, fleet_reads) with
   0, 1, 5 and 10 boards open. Target: the same rate (one read per refresh period) whatever the
   number of boards. The agent's CPU in each phase is printed too.
2. A change is pushed: with 10 boards open (10 processes as alice and bob, each a headless
   BoardApp on a SocketClient, exactly what `board` runs on the socket), the time from
   `board book 1 --for 10m --start +Nh` (the CLI, as alice) returning to every board having the
   booking in `app.view` (its bookings signal), and to the repaint after it. Median and max over
   --runs bookings (each cancelled afterwards). Target: 200 ms or less.
3. Service memory with 50 subscribed clients (as alice and bob, in 2 processes: each client
   holds a subscription to bookings, fleet, servers and notices and a second connection on
   which it reloads the window after every bookings event, as a board does), while bookings are
   made: VmRSS of the agent and its peak (stats.max_rss_kib). Target: 100 MB or less.

    sudo .venv/bin/python bench/bench_service.py [--runs 20] [--seconds 10] [--boards 10] [--clients 50]
                                                 [--only reads,push,rss] [--group boardusers]

Root only (bench/shared_install.py: the users, the layout, the agent as user board with CAP_KILL).
The agent, the boards and the scratch directory are gone at the end. About 2 minutes with the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from shared_install import BOARD, MEMBERS_GROUP, REPO, SharedInstall, as_user, cpu_seconds, rss_kib, shared_install  # noqa: E402

USERS = ("alice", "bob")


# -- the workers: run as alice or bob -----------------------------------------------------------


def _emitter():
    """Lines to the driver on a descriptor of our own: Textual captures sys.stdout while an app runs."""
    out = os.dup(1)
    lock = threading.Lock()

    def emit(line: str) -> None:
        with lock:
            os.write(out, (line + "\n").encode())

    return emit


def board_worker() -> None:
    """One headless board on the socket; says `view T IDS` each time its bookings view changes, `paint T IDS` after
    the repaint that follows (T: CLOCK_MONOTONIC, the same clock for every process on the machine)."""
    from app.client.socket import SocketClient
    from app.config import load_config
    from app.core.identity import Identity
    from app.tui.app import BoardApp

    emit = _emitter()
    config = load_config(None, os.environ)

    class ProbedClient(SocketClient):
        """Says when a bookings event arrives (`event T`) and when each window reload starts and ends
        (`loaded T0 T1 IDS`): where a push spends its time."""

        def subscribe(self, kinds):
            for event in super().subscribe(kinds):
                if event.get("event") == "bookings":
                    emit(f"event {time.monotonic():.6f}")
                yield event

        def call(self, op, **args):
            began = time.monotonic()
            result = super().call(op, **args)
            if op == "window":
                ids = json.dumps(sorted(b["id"] for b in result["upcoming"]), separators=(",", ":"))
                emit(f"loaded {began:.6f}:{time.monotonic():.6f} {ids}")
            return result

    client = ProbedClient(config.service.socket)
    me = client.call("whoami")

    class ProbedBoard(BoardApp):
        CSS_PATH = str(REPO / "app" / "tui" / "app.tcss")  # relative paths are taken from the subclass's module

        def on_mount(self) -> None:  # Textual runs BoardApp.on_mount too (every class's handler in the MRO)
            self.bookings_signal.subscribe(self, self._probe, immediate=True)

        def _probe(self, view) -> None:
            ids = json.dumps(sorted(b.id for b in view.upcoming), separators=(",", ":"))
            emit(f"view {time.monotonic():.6f} {ids}")
            if profiler is not None:
                profiler.enable()  # the UI thread, from the new view to its repaint

            def painted() -> None:
                if profiler is not None:
                    profiler.disable()
                emit(f"paint {time.monotonic():.6f} {ids}")

            self.call_after_refresh(painted)

    profile_to = os.environ.get("BENCH_PROFILE")
    profiler = None
    if profile_to:
        import cProfile

        profiler = cProfile.Profile()
    app = ProbedBoard(client, identity=Identity(me["user"], me["uid"], me["admin"]), config=config)

    def until_stdin_closes() -> None:
        sys.stdin.read()
        try:
            app.call_from_thread(app.exit)
        except RuntimeError:
            pass

    threading.Thread(target=until_stdin_closes, daemon=True).start()
    app.run(headless=True, size=(120, 40))
    if profiler is not None:
        profiler.dump_stats(profile_to)
    os._exit(0)  # the pollers are daemon threads blocked on the socket


def subscribers_worker(count: int) -> None:
    """`count` light clients: each a subscription plus a connection that reloads the window on every bookings event."""
    from app.client.socket import SocketClient
    from app.config import load_config

    emit = _emitter()
    path = load_config(None, os.environ).service.socket
    ready = threading.Barrier(count + 1)

    def client_loop() -> None:
        client = SocketClient(path)
        now = int(time.time())
        client.call("window", start=now - 3600, end=now + 86400)
        events = client.subscribe(("bookings", "fleet", "servers", "notice"))
        first = next(events)  # the first fleet snapshot: subscribed
        assert first.get("event") in ("fleet", "bookings"), first
        ready.wait()
        for event in events:
            if event.get("event") == "bookings":
                now = int(time.time())
                client.call("window", start=now - 3600, end=now + 86400)

    for _ in range(count):
        threading.Thread(target=client_loop, daemon=True).start()
    ready.wait(timeout=120)
    emit("ready")
    sys.stdin.read()
    os._exit(0)


# -- the driver -----------------------------------------------------------------------------------


class Workers:
    """Processes as alice and bob (alternately), their `kind t ids` lines gathered on one queue."""

    def __init__(self, install: SharedInstall) -> None:
        self.install = install
        self.children: list[subprocess.Popen] = []
        self.lines: queue.Queue = queue.Queue()

    def spawn(self, *args: str, **extra_env: str) -> int:
        index = len(self.children)
        user = USERS[index % len(USERS)]
        env = {**self.install.environ(user), "TERM": "xterm-256color", "PYTHONPATH": str(REPO), **extra_env}
        child = subprocess.Popen(as_user(user, [sys.executable, str(Path(__file__).resolve()), *args]),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=env, cwd=str(self.install.root), text=True)
        self.children.append(child)
        threading.Thread(target=self._read, args=(index, child), daemon=True).start()
        return index

    def _read(self, index: int, child: subprocess.Popen) -> None:
        for line in child.stdout:
            kind, _, rest = line.strip().partition(" ")
            self.lines.put((index, kind, rest))
        self.lines.put((index, "exit", ""))

    def wait_for(self, predicate, timeout: float, what: str):
        """Take lines until predicate(index, kind, rest) returns True; the lines are handed to it in order."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                index, kind, rest = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise SystemExit(f"timed out waiting for {what}") from None
            if kind == "exit":
                child = self.children[index]
                child.wait()
                raise SystemExit(f"worker {index} exited {child.returncode}: {child.stderr.read().strip()[-800:]}")
            if predicate(index, kind, rest):
                return

    def wait_views(self, indices: list[int], timeout: float = 60) -> None:
        pending = set(indices)

        def seen(index, kind, rest):
            if kind == "view":
                pending.discard(index)
            return not pending

        self.wait_for(seen, timeout, f"boards {sorted(pending)} to load their bookings")

    def stop(self) -> None:
        for child in self.children:
            try:
                child.stdin.close()
            except OSError:
                pass
        for child in self.children:
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def reads_phase(install: SharedInstall, seconds: float) -> dict:
    pid = install.agent_pid
    s0, c0, t0 = install.stats(), cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    s1, c1, t1 = install.stats(), cpu_seconds(pid), time.monotonic()
    return {"reads_per_s": (s1["fleet_reads"] - s0["fleet_reads"]) / (t1 - t0), "subscribers": s1["subscribers"],
            "agent_cpu_pct": 100 * (c1 - c0) / (t1 - t0), "rss_mb": rss_kib(pid) / 1024}


def bench_reads(install: SharedInstall, workers: Workers, boards: int, seconds: float) -> None:
    print(f"1. fleet reads per second with boards open ({seconds:g} s each; refresh_seconds 1):")
    print(f"   {'boards':>6} {'subscribers':>11} {'reads/s':>8} {'agent CPU':>9} {'agent RSS':>9}")
    steps = sorted({0, 1, min(5, boards), boards})
    rates = {}
    for target in steps:
        new = [workers.spawn("--board-worker") for _ in range(target - len(workers.children))]
        if new:
            workers.wait_views(new)
            time.sleep(2)  # their first window, history and servers calls are done
        row = reads_phase(install, seconds)
        rates[target] = row["reads_per_s"]
        print(f"   {target:>6} {row['subscribers']:>11} {row['reads_per_s']:>8.2f} {row['agent_cpu_pct']:>8.1f}%"
              f" {row['rss_mb']:>7.1f} MB")
    open_rates = [rate for n, rate in rates.items() if n > 0]
    spread = max(open_rates) - min(open_rates)
    print(f"   reads/s with boards open: {min(open_rates):.2f} to {max(open_rates):.2f}"
          f" (target: flat, one read per refresh period: {'met' if spread < 0.25 else 'NOT met'})")


def bench_push(install: SharedInstall, workers: Workers, boards: int, runs: int, profile: str | None = None) -> None:
    missing = boards - len(workers.children)
    if missing > 0:
        workers.wait_views([workers.spawn("--board-worker") for _ in range(missing)])
        time.sleep(2)
    if profile:  # one more board, profiled from each new view to its repaint, and counted like the others
        workers.wait_views([workers.spawn("--board-worker", BENCH_PROFILE=profile)])
        time.sleep(2)
        boards = len(workers.children)
    indices = list(range(boards))
    admin = install.client()
    view_lat, paint_lat, worst, cli = [], [], [], []
    phases: dict[str, list[float]] = {name: [] for name in (
        "event pushed (commit to board's thread)", "wake to window call", "window call round trip",
        "post to app.view", "app.view to repaint")}
    rng = random.Random(5)
    board_cpu: list[float] = []
    pids = [workers.children[i].pid for i in indices]
    idle0, t0 = sum(map(cpu_seconds, pids)), time.monotonic()
    time.sleep(3)
    idle_rate = (sum(map(cpu_seconds, pids)) - idle0) / (time.monotonic() - t0) / len(pids)  # CPU s per s per board
    try:
        for n in range(runs):
            argv = as_user("alice", [str(BOARD), "book", "1", "--for", "10m", "--start", f"+{n + 1}h", "--json"])
            cpu_before = [cpu_seconds(workers.children[i].pid) for i in indices]
            began = time.monotonic()
            result = subprocess.run(argv, capture_output=True, text=True, env=install.environ("alice"),
                                    cwd=str(install.root))
            returned = time.monotonic()
            if result.returncode != 0:
                raise SystemExit(f"board book failed: {result.stderr.strip()}")
            cli.append(returned - began)
            booking = json.loads(result.stdout)["id"]
            viewed: dict[int, float] = {}
            painted: dict[int, float] = {}
            events: dict[int, float] = {}
            loads: dict[int, tuple[float, float]] = {}

            def has_it(index, kind, rest):
                stamp, _, ids = rest.partition(" ")
                if index not in indices:
                    return False
                if kind == "event":
                    if float(stamp) >= began and index not in viewed:
                        events.setdefault(index, float(stamp))
                elif kind == "loaded":
                    if booking in json.loads(ids):
                        start, end = map(float, stamp.split(":"))
                        loads.setdefault(index, (start, end))
                elif kind in ("view", "paint") and booking in json.loads(ids):
                    (viewed if kind == "view" else painted).setdefault(index, float(stamp) - returned)
                return len(viewed) == len(indices) and len(painted) == len(indices)

            workers.wait_for(has_it, 15, f"every board to show booking {booking}")
            # What the boards spent from the booking until the last repaint (less their idle rate over that time).
            spent = sum(cpu_seconds(workers.children[i].pid) - c for i, c in zip(indices, cpu_before))
            board_cpu.append(spent / len(indices) - idle_rate * (time.monotonic() - began))
            view_lat += viewed.values()
            paint_lat += painted.values()
            for index in indices:
                if index in events and index in loads:
                    event_at, (load_start, load_end) = events[index], loads[index]
                    phases["event pushed (commit to board's thread)"].append(event_at - returned)
                    phases["wake to window call"].append(load_start - event_at)
                    phases["window call round trip"].append(load_end - load_start)
                    phases["post to app.view"].append(viewed[index] + returned - load_end)
                    phases["app.view to repaint"].append(painted[index] - viewed[index])
            worst.append(max(viewed.values()))
            admin.call("cancel", id=booking)
            gone: set[int] = set()

            def dropped(index, kind, rest):
                if kind == "view" and booking not in json.loads(rest.partition(" ")[2]):
                    gone.add(index)
                return len(gone) == len(indices)

            workers.wait_for(dropped, 15, f"every board to drop booking {booking}")
            time.sleep(rng.uniform(0.1, 0.6))  # off the 1 s fleet tick's phase
    finally:
        admin.close()

    def ms(values):
        p90 = sorted(values)[max(0, -(-len(values) * 9 // 10) - 1)]  # nearest rank
        return f"median {statistics.median(values) * 1000:6.1f} ms  p90 {p90 * 1000:6.1f} ms  max {max(values) * 1000:6.1f} ms"

    print(f"2. a booking pushed to {boards} boards ({runs} bookings; time after `board book` returned, per board):")
    print(f"   in app.view:           {ms(view_lat)}")
    print(f"   repainted:             {ms(paint_lat)}")
    print(f"   last of the {boards} boards:  {ms(worst)}   (target: 200 ms or less:"
          f" {'met' if max(worst) <= 0.2 else ('median met, max NOT' if statistics.median(worst) <= 0.2 else 'NOT met')})")
    print(f"   (the CLI itself, for scale: median {statistics.median(cli) * 1000:.0f} ms)")
    per_board = statistics.median(board_cpu)
    print(f"   CPU per board per pushed booking (less its idle rate, {idle_rate * 100:.1f} % of a core): median"
          f" {per_board * 1000:.1f} ms; {len(indices)} boards: {per_board * len(indices) * 1000:.0f} ms of CPU"
          f" on {os.cpu_count()} cores")
    print("   where the time goes, per board (event pushed: from the CLI's return, so it can be negative):")
    for name, values in phases.items():
        if values:
            print(f"     {name:42} {ms(values)}")


def bench_rss(install: SharedInstall, clients: int, bookings: int) -> None:
    pid = install.agent_pid
    deadline = time.monotonic() + 15
    while install.stats()["subscribers"] and time.monotonic() < deadline:
        time.sleep(0.2)  # the boards of the other parts have gone: the service notices within a second
    before = rss_kib(pid)
    workers = Workers(install)
    try:
        per_process = [clients // 2 + clients % 2, clients // 2]
        indices = [workers.spawn("--subscribers", str(count)) for count in per_process if count]
        ready: set[int] = set()

        def all_ready(index, kind, rest):
            if kind == "ready":
                ready.add(index)
            return ready == set(indices)

        workers.wait_for(all_ready, 120, f"{clients} subscribed clients")
        subscribed = install.stats()
        idle = rss_kib(pid)
        admin = install.client()
        samples = []
        try:
            for n in range(bookings):  # every one of them reloads its window after each
                install.run(USERS[n % 2], "book", "1", "--for", "10m", "--start", f"+{n + 1}h", check=True)
                samples.append(rss_kib(pid))
            time.sleep(1)
            stats = admin.call("stats")
        finally:
            admin.close()
        after = rss_kib(pid)
    finally:
        workers.stop()
    peak = max([idle, after, *samples])
    print(f"3. service memory with {subscribed['subscribers']} subscribed clients (as alice and bob):")
    print(f"   VmRSS: before {before / 1024:.1f} MB, subscribed and idle {idle / 1024:.1f} MB, during {bookings}"
          f" bookings up to {peak / 1024:.1f} MB, after {after / 1024:.1f} MB")
    print(f"   peak RSS (stats.max_rss_kib): {stats['max_rss_kib'] / 1024:.1f} MB"
          f"   (target: 100 MB or less: {'met' if stats['max_rss_kib'] <= 100 * 1024 else 'NOT met'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="bookings pushed to the boards (default 20)")
    parser.add_argument("--seconds", type=float, default=10.0, help="each fleet-reads phase (default 10)")
    parser.add_argument("--boards", type=int, default=10)
    parser.add_argument("--clients", type=int, default=50, help="subscribed clients for the memory figure")
    parser.add_argument("--only", default="reads,push,rss", help="a comma list of reads, push, rss")
    parser.add_argument("--group", default=MEMBERS_GROUP)
    parser.add_argument("--profile", action="store_true",
                        help="push: profile one board (cProfile, UI thread, new view to repaint) and print its top functions")
    parser.add_argument("--board-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--subscribers", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.board_worker:
        return board_worker()
    if args.subscribers:
        return subscribers_worker(args.subscribers)
    only = set(args.only.split(","))
    with shared_install(group=args.group) as install:
        install.run("alice", "status", check=True)  # opens the database
        print(f"agent pid {install.agent_pid} as user board on {install.socket}; simulated fleet")
        workers = Workers(install)
        try:
            if "reads" in only:
                bench_reads(install, workers, args.boards, args.seconds)
            if "push" in only:
                profile = str(install.root / "state" / "board.prof") if args.profile else None
                bench_push(install, workers, args.boards - (1 if profile else 0), args.runs, profile)
        finally:
            workers.stop()
        if "push" in only and args.profile:
            import pstats

            print(f"   the profiled board, UI thread from each new view to its repaint ({args.runs} bookings and"
                  f" {args.runs} cancellations), by own time:")
            pstats.Stats(profile).sort_stats("tottime").print_stats(15)
            pstats.Stats(profile).sort_stats("cumulative").print_stats(25)
        if "rss" in only:
            bench_rss(install, args.clients, bookings=20)


if __name__ == "__main__":
    main()
