"""A stranger cannot take the gateway down (issue 31, section 4): the gateway as its own process under
`prlimit --nofile=1024` (tests/fakes/gateway_alone.py: `board gateway`'s serving code on a fixed state), a
stranger's 2,000 idle and slow connections from loopback addresses of their own (no byte, half a head, a POST
with a made-up key that stops after one byte of its body), and a member's keyed completion, from 127.0.0.1,
answered within 2 s every 250 connections of the flood, while the gateway's descriptors leave room for an upstream
connection per connection it admits (its cap).

Before the door counted connections, the flood used up the 1,024 files: accept failed (EMFILE), the member's
connection waited in the backlog and the completion never came. Serial (tests/conftest.py): it holds a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from aiohttp import web

from app.gateway.connections import connection_cap
from tests.ports import port_range
from tests.unit.test_gateway_relay import KEY

pytestmark = pytest.mark.skipif(not shutil.which("prlimit"), reason="needs prlimit (util-linux)")
REPO = Path(__file__).resolve().parents[2]
OPEN_FILES = 1024
FLOOD = 2000
STRANGER_ADDRESSES = 20  # 127.0.0.2 to 127.0.0.21: 100 each, under the per-address cap, so the cap in all is tried
GIVE_UP = 10  # connections the stranger could not open, after which the flood stops: the gateway is down
CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest.fixture
def upstream():
    """llama-server's stand-in, on its own loop in a thread of this process (so its files are not the gateway's)."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box = {}

    async def chat(request):
        await request.read()
        return web.json_response({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

    async def start():
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        box["runner"] = runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["url"] = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    assert started.wait(30)
    yield box["url"]
    asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(30)


def health(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return answer.status
    except OSError:
        return None


def stranger_bytes(i: int) -> bytes:
    """Nothing, half a head, or a whole head with a made-up key and one byte of a 100-byte body."""
    return (b"", b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n",
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer bk-made-up\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")[i % 3]


async def member_completion(port: int) -> tuple[float, int | None]:
    """(seconds, status) of one keyed completion from 127.0.0.1; status None: no answer within 10 s."""
    started = time.monotonic()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer " + KEY.encode() +
                     b"\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(CHAT)
                     + CHAT)
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    except (OSError, asyncio.TimeoutError):
        return time.monotonic() - started, None
    return time.monotonic() - started, int(answer.split(b" ", 2)[1]) if answer else None


async def flood(port: int, pid: int) -> tuple[list[tuple[float, int | None]], list[int], int]:
    """The stranger's connections, held to the end; every 250 of them, the gateway's descriptors and a member's
    completion. Returns (the completions, the descriptor counts, the connections the stranger could not open)."""
    held, completions, descriptors, failed = [], [], [], 0
    for i in range(FLOOD):
        source = f"127.0.0.{2 + i % STRANGER_ADDRESSES}"
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)), 2)
            writer.write(stranger_bytes(i))
            held.append(writer)
        except (OSError, asyncio.TimeoutError):  # the old gateway, out of files: its backlog full
            failed += 1
        if i % 250 == 249 or failed == GIVE_UP:
            descriptors.append(len(os.listdir(f"/proc/{pid}/fd")))
            completions.append(await member_completion(port))
        if failed == GIVE_UP:  # a gateway that lets no one in: the rest would only wait
            break
    for writer in held:
        writer.transport.abort()
    return completions, descriptors, failed


def test_a_strangers_2000_idle_and_slow_connections_leave_a_members_completion_answered_within_2_s(upstream,
                                                                                                 tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 3 * FLOOD), hard))  # the stranger's end needs 2,000
    port = port_range("gateway", 10)[0] + 5
    log = tmp_path / "gateway.log"
    with log.open("wb") as sink:
        gateway = subprocess.Popen(["prlimit", f"--nofile={OPEN_FILES}:{OPEN_FILES}", sys.executable, "-m",
                                    "tests.fakes.gateway_alone", upstream, f"127.0.0.1:{port}"],
                                   cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while health(port) != 200 and gateway.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert health(port) == 200, log.read_text()
        completions, descriptors, failed = asyncio.run(flood(port, gateway.pid))
        assert gateway.poll() is None, log.read_text()[-2000:]
    finally:
        gateway.terminate()
        gateway.wait(30)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    cap = connection_cap(4096, OPEN_FILES)
    print(f"member completions (s, status): {completions}; gateway descriptors: {descriptors} (cap {cap});"
          f" stranger connections not opened: {failed}")
    assert len(completions) == FLOOD // 250
    assert all(status == 200 and seconds < 2 for seconds, status in completions), completions
    assert max(descriptors) + cap <= OPEN_FILES, descriptors  # room left for an upstream per admitted connection
    assert f"at most {cap} connections" in log.read_text()


def test_out_of_files_at_accept_the_gateway_backs_off_and_serves_on(upstream, tmp_path):
    """At 100 open files the cap is 1 connection; the gateway is stopped (SIGSTOP) while a stranger fills its
    backlog with 128 connections, so that at SIGCONT asyncio accepts more than its files hold: accept fails with
    EMFILE, waits a second, and goes on. A member's completion is answered after (within 10 s: the accept's wait and
    the member's SYN sent again while the backlog was full)."""
    import signal

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 3 * FLOOD), hard))
    port = port_range("gateway", 10)[0] + 6
    log = tmp_path / "gateway.log"
    with log.open("wb") as sink:
        gateway = subprocess.Popen(["prlimit", "--nofile=100:100", sys.executable, "-m", "tests.fakes.gateway_alone",
                                    upstream, f"127.0.0.1:{port}"], cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)

    async def stranger_then_member():
        held = []
        os.kill(gateway.pid, signal.SIGSTOP)
        try:
            for i in range(128):
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", port, local_addr=(f"127.0.0.{2 + i % 20}", 0)), 5)
                held.append(writer)
        finally:
            os.kill(gateway.pid, signal.SIGCONT)
        answer = await member_completion(port)
        for writer in held:
            writer.transport.abort()
        return answer

    try:
        deadline = time.monotonic() + 30
        while health(port) != 200 and gateway.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert health(port) == 200, log.read_text()
        seconds, status = asyncio.run(stranger_then_member())
        assert status == 200 and gateway.poll() is None, log.read_text()[-3000:]
    finally:
        gateway.terminate()
        gateway.wait(30)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    logged = log.read_text()
    assert "Too many open files" in logged and "at most 1 connections" in logged, logged[-3000:]
    assert "raise LimitNOFILE= in the unit" in logged
