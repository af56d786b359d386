"""The gateway's memory under an endless streamed line (issue 31, section 4): its peak RSS while CLIENTS clients
at once (default 10) get a stream whose upstream sends one line of LINE_MB (default 256) with no newline. The
gateway is tests/fakes/gateway_alone.py (`board gateway`'s serving code on a fixed state), as its own process.

    CLIENTS=10 LINE_MB=256 .venv/bin/python bench/bench_gateway_memory.py     (from the repo root)
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

from aiohttp import web

MB = 1 << 20
CLIENTS, LINE_MB = int(os.environ.get("CLIENTS", 10)), int(os.environ.get("LINE_MB", 256))
PORT = int(os.environ.get("PORT", 32690))
BODY = json.dumps({"model": "m", "stream": True, "messages": []}).encode()


async def endless(request: web.Request) -> web.StreamResponse:
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b'data: {"choices":[{"delta":{"content":"')
    piece = b"x" * (64 * 1024)
    try:
        for _ in range(LINE_MB * MB // len(piece)):
            await response.write(piece)
    except ConnectionError:
        pass
    return response


def upstream(box: dict, ready: threading.Event) -> None:
    loop = asyncio.new_event_loop()

    async def start():
        app = web.Application()
        app.router.add_post("/v1/chat/completions", endless)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["url"] = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    loop.run_until_complete(start())
    ready.set()
    loop.run_forever()


def memory(pid: int) -> dict[str, int]:
    lines = (line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines())
    return {key: int(value.split()[0]) for key, value in lines if key in ("VmRSS", "VmHWM")}


async def client() -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", PORT)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer bk-client-key\r\n"
                 b"Content-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)
    received = 0
    while chunk := await reader.read(MB):
        received += len(chunk)
    return received


async def clients() -> list[int]:
    return await asyncio.gather(*(client() for _ in range(CLIENTS)))


def main() -> None:
    box: dict = {}
    ready = threading.Event()
    threading.Thread(target=upstream, args=(box, ready), daemon=True).start()
    ready.wait(30)
    gateway = subprocess.Popen([sys.executable, "-m", "tests.fakes.gateway_alone", box["url"], f"127.0.0.1:{PORT}"],
                               stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        before = memory(gateway.pid)
        started = time.monotonic()
        sizes = asyncio.run(clients())
        after = memory(gateway.pid)
    finally:
        gateway.terminate()
        gateway.wait()
    print(f"gateway RSS before: {before['VmRSS']} kB; after {CLIENTS} endless lines of {LINE_MB} MB at once:"
          f" {after['VmRSS']} kB, peak {after['VmHWM']} kB; each client got {min(sizes) / MB:.1f} to"
          f" {max(sizes) / MB:.1f} MB in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
