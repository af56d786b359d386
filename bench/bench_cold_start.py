"""A catalog model's cold start, from a keyed request to its first token, through the whole stack (figures, not
assertions; docs/gateway.md#cold-start-measured).

The real agent (user board), the real `board runner` (user board-llama), the real gateway (user board-gateway)
and the official `openai` client, set up as tests/llama/test_gateway.py sets them up, with one catalog entry
([[models]]) for the tests' tiny model on the simulated fleet. Each run:

1. waits until `models` says the entry is cold (no live booking, no server of its own still up);
2. asks it for a streamed chat completion as alice and times the first content token: the gateway's
   `model_demand`, the booking, the plan, the runner's start, llama-server's load, the relay;
3. asks again at once, warm, for the same figure without the start;
4. releases the booking as an admin may, so that the next run starts cold (ttl_s is long, so that no lease runs
   out inside a run);

and, interleaved, starts llama-server by hand on the same file and polls /health (bench/bench_llama.py's
`by_hand`): the load alone. Cold minus warm minus the load is what board adds to a cold start. A cold start that
fails is counted and said; the gateway's and agent's logs are kept in /tmp/bench-cold-start-*.log.

    BOARD_LLAMA_SERVER=$(scripts/build_llama_server.sh) .venv/bin/python bench/bench_cold_start.py [--runs 9]

Root only (it makes the users, as the real-user tests do).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_llama import by_hand  # noqa: E402
from tests import agent_process  # noqa: E402
from tests.llama.test_gateway import Team  # noqa: E402
from tests.llama.test_servers_service import SharedBoard, start_runner  # noqa: E402
from tests.llama.tiny_gguf import write_tiny_gguf  # noqa: E402
from tests.ports import port_range  # noqa: E402
from tests.shared_install import scratch_dir  # noqa: E402
from tests.unix_users import (  # noqa: E402
    GATEWAY_USER, MEMBERS_GROUP, RUNNER_USER, cannot_run_checkout, ensure_system_user, ensure_unix_users,
)

ALIAS = "tiny-cold"
TTL_S = 30  # long enough that no lease runs out during a run: each run ends it by releasing the booking
DRAIN_S = 1
CATALOG = f"""
[gateway]
listen = "{{listen}}"
drain_s = {DRAIN_S}

[[models]]
alias = "{ALIAS}"
model = "{{model}}"
ctx = 256
ttl_s = {TTL_S}
"""


def entry(root_client) -> dict:
    [found] = [m for m in root_client.call("models") if m["alias"] == ALIAS]
    return found


def release(root_client) -> None:
    """End the entry's on-demand booking now, as an admin may (the enforcement then stops its server), so that the
    next run starts cold."""
    root_client.call("release", id=entry(root_client)["booking"])


def wait_cold(root_client, timeout: float = 60) -> float:
    """Seconds until the entry is cold with no live server of its own; fails after `timeout`."""
    started = time.perf_counter()
    while True:
        if entry(root_client)["state"] == "cold" and not [
                s for s in root_client.call("serve_list", all=True, limit=50)
                if s["alias"] == ALIAS and s["state"] in ("starting", "ready", "stopping")]:
            return time.perf_counter() - started
        if time.perf_counter() - started > timeout:
            raise SystemExit(f"{ALIAS} did not go cold in {timeout:g} s: {entry(root_client)}")
        time.sleep(0.1)


def first_token(client) -> tuple[float, str | None]:
    """Seconds from the request to the first chunk with content, and the model the reply names."""
    started = time.perf_counter()
    stream = client.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                            temperature=0, stream=True)
    elapsed, model = None, None
    for chunk in stream:
        model = chunk.model or model
        if elapsed is None and chunk.choices and chunk.choices[0].delta.content is not None:
            elapsed = time.perf_counter() - started
    if elapsed is None:
        raise SystemExit("the stream brought no content")
    return elapsed, model


def row(name: str, values: list[float]) -> str:
    spread = max(values) - min(values)
    return (f"{name:46} {statistics.median(values) * 1000:9.0f} {min(values) * 1000:7.0f} {max(values) * 1000:7.0f}"
            f" {spread * 1000:7.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    runs = parser.parse_args().runs
    if os.geteuid() != 0:
        raise SystemExit("bench_cold_start needs root: it makes the users and runs each daemon as its own")
    binary = os.environ.get("BOARD_LLAMA_SERVER")
    if not binary or not os.access(binary, os.X_OK):
        raise SystemExit("set BOARD_LLAMA_SERVER to a llama-server binary (scripts/build_llama_server.sh prints it)")
    import openai

    ensure_unix_users()
    ensure_system_user(GATEWAY_USER, MEMBERS_GROUP)
    ensure_system_user(RUNNER_USER, MEMBERS_GROUP)
    for name in ("board", "alice", GATEWAY_USER, RUNNER_USER):
        if problem := cannot_run_checkout(name):
            raise SystemExit(problem)
    root = scratch_dir("board-bench-cold-")
    tiny = write_tiny_gguf(root / "tiny.gguf")
    size = tiny.stat().st_size
    board = SharedBoard(root, binary, tiny)
    team = Team(board, root)
    base = port_range("gateway", 10)[0]  # the gateway's port, and the by-hand server's
    team.port = base + 9
    team.url = f"http://127.0.0.1:{team.port}"
    board.agent.config.write_text(board.agent.config.read_text() + CATALOG.replace(
        "{listen}", f"127.0.0.1:{team.port}").replace("{model}", str(board.model)))
    runner = root_client = None
    try:
        board.agent.start()
        root_client = board.agent.client()
        runner = start_runner(board)
        team.start_gateway()
        client = openai.OpenAI(base_url=f"{team.url}/v1", api_key=team.key("alice")["key"], max_retries=0,
                               timeout=120)
        cold, warm, hand, cooled = [], [], [], []
        failed: list[str] = []
        for _ in range(runs):  # interleaved, so machine noise hits each alike
            cooled.append(wait_cold(root_client))
            try:
                elapsed, model = first_token(client)
            except openai.APIError as error:  # counted and said: a cold start that fails is a finding too
                failed.append(str(error))
                print(f"run {len(cold) + len(failed)}: cold start failed: {error}", file=sys.stderr, flush=True)
                continue
            assert model == ALIAS, model
            cold.append(elapsed)
            warm.append(first_token(client)[0])
            release(root_client)
            hand.append(by_hand(binary, board.model, base + 8, root / "hand.log"))
            print(f"run {len(cold) + len(failed)}: cold {cold[-1]:.3f} s, warm {warm[-1]:.3f} s, by hand {hand[-1]:.3f} s,"
                  f" cold again after {cooled[-1]:.1f} s",
                  file=sys.stderr, flush=True)
    finally:
        if team.gateway is not None:  # what the gateway and the service said, kept for a look
            for name, path in (("gateway", team.log), ("agent", board.agent.log)):
                shutil.copy(path, f"/tmp/bench-cold-start-{name}.log")
        if root_client is not None:
            root_client.close()
        if team.gateway is not None:
            agent_process.stop(team.gateway)
        if runner is not None:
            runner.terminate()
            runner.wait(15)
        board.agent.stop()
        shutil.rmtree(root, ignore_errors=True)

    print(f"{runs} runs; the tests' tiny model (llama, 64 wide, 2 layers, {size} bytes), ctx 256,"
          f" CPU llama-server, {os.cpu_count()} CPUs")
    print(f"{'':46} {'median ms':>9} {'min':>7} {'max':>7} {'spread':>7}")
    if failed:
        print(f"{len(failed)} of {runs} cold starts failed (logs in /tmp/bench-cold-start-*.log): {failed[0]}")
    print(row("cold: request to first token (openai, stream)", cold))
    print(row("warm: request to first token", warm))
    print(row("llama-server by hand: start to /health 200", hand))
    added = statistics.median(cold) - statistics.median(warm) - statistics.median(hand)
    print(f"{'  board adds to a cold start (cold-warm-load)':46} {added * 1000:+9.0f}")
    print(row("released to cold (its server stopped)", cooled[1:] or cooled))


if __name__ == "__main__":
    main()
