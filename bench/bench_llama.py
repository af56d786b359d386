"""llama-server through board, against llama-server by hand, in the same run on the same tiny model.

1. Start to ready: `board serve start` (the whole CLI, returning at /health 200) against launching
   llama-server by hand and polling /health (same probe, same 20 ms interval). Interleaved runs,
   medians; the difference is board's overhead. Target: +300 ms or less.
2. Stop latency for a server that exits on SIGTERM: `board serve stop` (the whole CLI) and the
   in-process ServerService.stop() (SIGTERM to the group until no process of it is left, and the
   row says stopped). Target: 1 s or less.

    BOARD_LLAMA_SERVER=$(scripts/build_llama_server.sh | tail -n 1) .venv/bin/python bench/bench_llama.py [--runs 7]
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

from app.llama.health import health  # noqa: E402
from tests.llama.tiny_gguf import write_tiny_gguf  # noqa: E402

POLL_S = 0.02


def by_hand(binary: str, model: Path, port: int, log: Path) -> float:
    argv = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "256", "-np", "1",
            "-ngl", "999", "--split-mode", "layer", "--alias", "tiny"]
    with open(log, "ab") as out:
        started = time.perf_counter()
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
        while health("127.0.0.1", port, timeout=1.0) != 200:
            if process.poll() is not None:
                raise SystemExit(f"llama-server by hand exited with {process.returncode}; see {log}")
            time.sleep(POLL_S)
        elapsed = time.perf_counter() - started
    process.terminate()
    process.wait(10)
    return elapsed


def board(args: list[str], env: dict) -> tuple[float, str]:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "app", *args], env=env, cwd=REPO, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"board {' '.join(args)} failed: {result.stderr.strip()}")
    return elapsed, result.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    binary = os.environ.get("BOARD_LLAMA_SERVER")
    if not binary or not os.access(binary, os.X_OK):
        raise SystemExit("set BOARD_LLAMA_SERVER to a llama-server binary (make llama-server prints its path)")
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        model = write_tiny_gguf(tmp_path / "tiny.gguf")
        config = tmp_path / "board.toml"
        config.write_text("[llama]\nport_min = 28100\nport_max = 28199\n")
        env = {**os.environ, "BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": "1",
               "BOARD_CONFIG": str(config), "BOARD_LLAMA_SERVER": binary}
        _, out = board(["book", "--cards", "0", "--for", "2h", "--json"], env)
        import json

        booking = str(json.loads(out)["id"])

        hand, through_board, stop_cli = [], [], []
        for n in range(runs):  # interleaved, so machine noise hits both alike
            hand.append(by_hand(binary, model, 28000 + n, tmp_path / "hand.log"))
            elapsed, out = board(["serve", "start", booking, "--model", str(model), "--ctx", "256", "--json"], env)
            through_board.append(elapsed)
            server_id = str(json.loads(out)["id"])
            elapsed, _ = board(["serve", "stop", server_id], env)
            stop_cli.append(elapsed)

        # The stop itself, without the CLI's interpreter start: in process, on a fresh server each time.
        from app.config import load_config
        from app.core.identity import current_identity
        from app.llama.service import ServerService
        from app.store.db import connect

        cfg = load_config(None, env)
        conn = connect(cfg.db_path)
        service = ServerService(conn, current_identity(cfg.admin_group), cfg, environ=env)
        stop_core = []
        for _ in range(runs):
            _, out = board(["serve", "start", booking, "--model", str(model), "--ctx", "256", "--json"], env)
            server_id = json.loads(out)["id"]
            started = time.perf_counter()
            stopped = service.stop(server_id)
            stop_core.append(time.perf_counter() - started)
            assert stopped.state == "stopped", stopped

    def row(name: str, values: list[float]) -> str:
        return (f"{name:44} {statistics.median(values) * 1000:9.0f} {min(values) * 1000:7.0f}"
                f" {max(values) * 1000:7.0f}")

    print(f"{runs} runs each, interleaved; tiny model (llama, 64 wide, 2 layers), ctx 256, CPU llama-server")
    print(f"{'':44} {'median ms':>9} {'min':>7} {'max':>7}")
    print(row("start to ready: llama-server by hand", hand))
    print(row("start to ready: board serve start", through_board))
    overhead = statistics.median(through_board) - statistics.median(hand)
    print(f"{'  overhead of board (median difference)':44} {overhead * 1000:+9.0f}   target +300 or less:"
          f" {'ok' if overhead <= 0.3 else 'OVER'}")
    best = min(through_board) - min(hand)
    print(f"{'  overhead, best runs (min difference)':44} {best * 1000:+9.0f}   (robust when other work shares the CPUs)")
    print(row("stop: board serve stop (whole CLI)", stop_cli))
    print(row("stop: ServerService.stop (SIGTERM → group gone)", stop_core))
    worst = statistics.median(stop_cli)
    print(f"{'  stop latency (CLI median)':44} {worst * 1000:9.0f}   target 1000 or less: {'ok' if worst <= 1 else 'OVER'}")


if __name__ == "__main__":
    main()
