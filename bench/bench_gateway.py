"""board gateway against calling the upstream directly, side by side in one run (figures, not assertions).

1. An upstream that answers at once (aiohttp, in its own process), to measure the gateway alone:
   - added latency per non-streamed request, p50 (target: 2 ms or less);
   - added time per streamed chunk, p50 over runs of one stream of CHUNKS chunks (target: 1 ms or less);
2. 200 concurrent streams through one gateway: errors, the gateway's RSS (target: 150 MB or less) and its CPU
   time per streamed token;
3. with BOARD_LLAMA_SERVER set, the real llama-server on the tests' tiny model: tokens/s through the gateway
   against direct (target: 0.97x or more).

The gateway runs in its own process as `board gateway` builds it (app.gateway.server.Gateway), with a stand-in for
the service's socket that returns one fixed gateway_state, so that only the HTTP path is measured.

    .venv/bin/python bench/bench_gateway.py [--runs 300] [--streams 200]
    BOARD_LLAMA_SERVER=$(scripts/build_llama_server.sh | tail -n 1) .venv/bin/python bench/bench_gateway.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

KEY = "bk-bench-key"
CHUNKS = 50
ANSWER = {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant",
          "content": "ok"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 5, "completion_tokens": 1}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the child processes -----------------------------------------------------------------------------------


def run_upstream(port: int) -> None:
    """An OpenAI-shaped upstream that answers at once: JSON, or CHUNKS SSE chunks and [DONE]."""
    from aiohttp import web

    chunk = b'data: {"choices":[{"index":0,"delta":{"content":"t"}}]}\n\n'
    last = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":%d}}\n\ndata: [DONE]\n\n' % CHUNKS

    async def chat(request):
        body = await request.json()
        if not body.get("stream"):
            return web.json_response(ANSWER)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        paced = body.get("paced")
        for _ in range(int(body.get("max_tokens") or CHUNKS)):
            if paced:  # each chunk its own write, stamped when sent (one clock: the same host)
                await response.write(b'data: {"t": %r}\n\n' % time.time())
                await asyncio.sleep(paced)
            else:
                await response.write(chunk)
        await response.write(last)
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


class FixedState:
    """The service's socket, for the bench: one gateway_state, no events, accounting dropped."""
    path = "(bench)"

    def __init__(self, upstream: str, parallel: int) -> None:
        from app.core.keys import key_hash

        self.state = {"servers": [{"id": 1, "alias": "m", "url": upstream, "api_key": None, "parallel": parallel,
                                   "user": "bench", "booking": 1, "booking_end": None, "cards": [0], "state": "ready"}],
                      "planned": [], "keys": [{"id": 1, "hash": key_hash(KEY), "user": "bench", "models": None,
                                               "class": "online", "expires": None, "revoked": None,
                                               "fingerprint": "bench"}]}
        self._closed = threading.Event()

    def call(self, op, **args):
        return self.state if op == "gateway_state" else {"recorded": len(args.get("records", []))}

    def subscribe(self, kinds):
        self._closed.wait()
        return iter(())

    def close(self):
        self._closed.set()


def run_gateway(port: int, upstream: str, parallel: int) -> None:

    from app.config import Config, GatewaySettings
    from app.gateway import server

    logging.disable(logging.INFO)  # one line per request would measure the journal, not the relay
    config = Config(gateway=GatewaySettings(max_concurrent_per_user=100_000, queue_timeout_s=600))
    gateway = server.Gateway(config, FixedState(upstream, parallel))
    asyncio.run(server.serve(gateway, f"127.0.0.1:{port}"))


def spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_port(port: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"a helper exited: {process.stderr.read().decode()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


# -- the measurements --------------------------------------------------------------------------------------


async def one(session, base: str, body: dict) -> tuple[float, int]:
    started = time.perf_counter()
    async with session.post(f"{base}/v1/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {KEY}"}) as response:
        chunks = 0
        async for _ in response.content.iter_any():
            chunks += 1
        assert response.status == 200, response.status
    return time.perf_counter() - started, chunks


async def latencies(direct: str, gateway: str, runs: int, stream: bool) -> tuple[list[float], list[float]]:
    """Interleaved: one direct, one through the gateway, `runs` times each, over kept-alive connections."""
    import aiohttp

    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": stream, "max_tokens": CHUNKS}
    a, b = [], []
    async with aiohttp.ClientSession() as session:
        for _ in range(10):  # warm both paths
            await one(session, direct, body)
            await one(session, gateway, body)
        for _ in range(runs):
            a.append((await one(session, direct, body))[0])
            b.append((await one(session, gateway, body))[0])
    return a, b


async def chunk_delays(base: str, runs: int) -> list[float]:
    """Per chunk: from the upstream's write to the client's read of its line, for streams of paced chunks."""
    import aiohttp

    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": CHUNKS,
            "paced": 0.002}
    delays = []
    async with aiohttp.ClientSession() as session:
        for _ in range(runs):
            async with session.post(f"{base}/v1/chat/completions", json=body,
                                    headers={"Authorization": f"Bearer {KEY}"}) as response:
                async for line in response.content:
                    if line.startswith(b'data: {"t"'):
                        delays.append(time.time() - json.loads(line[6:])["t"])
    return delays


async def crowd(gateway: str, streams: int, tokens: int) -> tuple[int, int]:
    import aiohttp

    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": tokens}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        results = await asyncio.gather(*(one(session, gateway, body) for _ in range(streams)), return_exceptions=True)
    errors = sum(isinstance(r, BaseException) for r in results)
    return errors, streams - errors


def process_figures(pid: int) -> tuple[float, float]:
    """(RSS in MB, CPU seconds) of a process."""
    import psutil

    process = psutil.Process(pid)
    times = process.cpu_times()
    return process.memory_info().rss / 1e6, times.user + times.system


def tokens_per_second(base: str, key: str | None, n: int = 5) -> float:
    import urllib.request

    rates = []
    for _ in range(n):
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "tell a story"}], "max_tokens": 128,
                           "ignore_eos": True, "stream": True}).encode()
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        started = time.perf_counter()
        tokens = 0
        with urllib.request.urlopen(urllib.request.Request(f"{base}/v1/chat/completions", data=body,
                                                           headers=headers), timeout=120) as response:
            for line in response:
                if line.startswith(b"data: {") and b'"content"' in line:
                    tokens += 1
        rates.append(tokens / (time.perf_counter() - started))
    return statistics.median(rates)


def real_llama(binary: str) -> None:
    from tests.llama.tiny_gguf import write_tiny_gguf

    with tempfile.TemporaryDirectory() as folder:
        model = write_tiny_gguf(Path(folder) / "tiny.gguf")
        port, gport = free_port(), free_port()
        llama = subprocess.Popen([binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-c", "512",
                                  "-np", "1", "-t", "1", "--alias", "m"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        gateway = spawn("--serve-gateway", str(gport), f"http://127.0.0.1:{port}", "1")
        try:
            wait_port(gport, gateway)
            from app.llama.health import health

            deadline = time.monotonic() + 60
            while health("127.0.0.1", port, timeout=1.0) != 200 and time.monotonic() < deadline:
                time.sleep(0.1)
            tokens_per_second(f"http://127.0.0.1:{port}", None, 2)  # warm up
            direct, through = [], []
            for _ in range(3):  # interleaved
                direct.append(tokens_per_second(f"http://127.0.0.1:{port}", None))
                through.append(tokens_per_second(f"http://127.0.0.1:{gport}", KEY))
            d, g = statistics.median(direct), statistics.median(through)
            print(f"real llama-server (tiny model on 1 CPU thread, 128 tokens streamed): direct {d:.0f} tok/s,"
                  f" through the gateway {g:.0f} tok/s: {g / d:.3f}x (target >= 0.97x)")
        finally:
            for process in (gateway, llama):
                process.terminate()
                process.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-gateway", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        return run_upstream(args.serve_upstream)
    if args.serve_gateway:
        port, upstream, parallel = args.serve_gateway
        return run_gateway(int(port), upstream, int(parallel))

    uport, gport = free_port(), free_port()
    upstream = spawn("--serve-upstream", str(uport))
    gateway = spawn("--serve-gateway", str(gport), f"http://127.0.0.1:{uport}", str(args.streams))
    try:
        wait_port(uport, upstream)
        wait_port(gport, gateway)
        direct, through = f"http://127.0.0.1:{uport}", f"http://127.0.0.1:{gport}"
        print(f"board gateway bench: {os.cpu_count()} CPUs, {args.runs} interleaved runs each")
        a, b = asyncio.run(latencies(direct, through, args.runs, stream=False))
        added = statistics.median(b) - statistics.median(a)
        print(f"non-streamed request: direct p50 {statistics.median(a) * 1e3:.2f} ms, through the gateway p50"
              f" {statistics.median(b) * 1e3:.2f} ms: +{added * 1e3:.2f} ms (target <= 2 ms)")
        a, b = [], []
        for _ in range(max(1, args.runs // 30)):  # interleaved
            a += asyncio.run(chunk_delays(direct, 3))
            b += asyncio.run(chunk_delays(through, 3))
        added = statistics.median(b) - statistics.median(a)
        print(f"streamed chunk (one write each, 2 ms apart; {len(a)} chunks each way): upstream write to client read"
              f" p50 direct {statistics.median(a) * 1e3:.3f} ms, through the gateway {statistics.median(b) * 1e3:.3f} ms:"
              f" +{added * 1e3:.3f} ms per chunk (target <= 1 ms)")
        tokens = 100
        rss0, cpu0 = process_figures(gateway.pid)
        started = time.perf_counter()
        errors, ok = asyncio.run(crowd(through, args.streams, tokens))
        took = time.perf_counter() - started
        rss, cpu = process_figures(gateway.pid)
        print(f"{args.streams} concurrent streams of {tokens} tokens: {errors} errors, {took:.2f} s; gateway RSS"
              f" {rss:.0f} MB (target <= 150 MB; {rss0:.0f} MB before), CPU {(cpu - cpu0) / (ok * tokens) * 1e6:.1f} µs"
              f" per streamed token")
    finally:
        for process in (gateway, upstream):
            process.terminate()
            process.wait(10)
    binary = os.environ.get("BOARD_LLAMA_SERVER")
    if binary:
        real_llama(binary)
    else:
        print("real llama-server: skipped (set BOARD_LLAMA_SERVER)")


if __name__ == "__main__":
    main()
