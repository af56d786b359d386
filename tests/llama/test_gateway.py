"""board gateway end to end: the real agent (user board), a real CPU llama-server started by a member through the
service, and the gateway run as its unit runs it (setpriv --reuid board-gateway, no capabilities), driven by the
official `openai` client (sync and async, plain and streamed) and by curl for raw SSE.

Needs root (real users) and the llama-server binary; skipped with the reason otherwise. One shared install for the
module: starting llama-servers is the slow part.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests import agent_process
from tests.llama.test_servers_service import SharedBoard
from tests.ports import port_range
from tests.service.support import check_reachable, needs_root
from tests.shared_install import read_rows, scratch_dir
from tests.unix_users import ADMIN_GROUP, GATEWAY_USER, MEMBERS_GROUP, ensure_system_user, ensure_unix_users

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.real_users, pytest.mark.usefixtures("_subreaper")]
BOARD = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "board"
ALIAS = "team-llm"
TEAM_ALIAS = "shared-llm"  # [gateway.team_aliases] in the fixture's config: alice and the admins' group serve it


def wait_for(predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def http(url: str, body: dict | bytes | None = None, key: str | None = None, timeout: float = 30):
    """(status, headers, parsed JSON or text) of one request."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, head, raw = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        status, head, raw = error.code, dict(error.headers), error.read()
    try:
        return status, head, json.loads(raw)
    except ValueError:
        return status, head, raw.decode()


class Team:
    """The shared install, alice's server `team-llm` and the gateway in front of it."""

    def __init__(self, board: SharedBoard, root: Path) -> None:
        self.board, self.root = board, root
        self.gateway: subprocess.Popen | None = None
        self.port = port_range("gateway", 10)[0]
        self.url = f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.root / "gateway.log"

    def start_gateway(self) -> None:
        # `python -m app` in the checkout (start_daemon's cwd): the gateway under test is this checkout's, also where
        # the venv's `board` is another checkout's editable install.
        self.gateway = agent_process.start_daemon(GATEWAY_USER, [sys.executable, "-m", "app"], ["gateway"],
                                                  self.board.agent.config, self.log)
        if not wait_for(lambda: self.gateway.poll() is not None or self.health() == 200):
            raise AssertionError(f"the gateway did not come up:\n{self.log.read_text()}")
        assert self.gateway.poll() is None, self.log.read_text()

    def health(self) -> int | None:
        try:
            return http(f"{self.url}/health", timeout=2)[0]
        except OSError:
            return None

    def models(self) -> dict:
        return http(f"{self.url}/health")[2]

    def key(self, user: str, *args: str) -> dict:
        return self.board.json(user, "key", "new", *args)

    def serve(self, user: str, card: int, alias: str = ALIAS, ctx: int = 512, parallel: int = 2) -> dict:
        booking = self.board.json(user, "book", "--cards", str(card), "--for", "2h")["id"]
        server = self.board.json(user, "serve", "start", str(booking), "--model", str(self.board.model), "--ctx",
                                 str(ctx), "--parallel", str(parallel), "--alias", alias)
        assert server["state"] == "ready", server
        # Each server has its own key (docs/llama.md): the holder reads it to reach the server's port directly.
        return {**server, "api_key": self.board.json(user, "serve", "key", str(server["id"]))["key"]}

    def client(self, key: str, **options):
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=60, **options)

    def usage_rows(self) -> list[tuple]:
        return read_rows(self.board.agent.db, "SELECT key_id, server_id, status, prompt_tokens, completion_tokens"
                                              " FROM gateway_usage ORDER BY id")


@contextlib.contextmanager
def running_team(llama_server, tiny_model, config: str, port: int = 0):
    """The shared install with `config` added (`{listen}`: the gateway's address, the `port`th of the gateway's
    band, from 0; `{model}`: the tiny model's path), alice's server `team-llm` on card 2 and the gateway in front of
    it; all stopped after."""
    needs_root()
    ensure_unix_users()
    ensure_system_user(GATEWAY_USER, MEMBERS_GROUP)
    for name in ("board", "alice", GATEWAY_USER):
        check_reachable(name)
    root = scratch_dir("board-gateway-")
    board = SharedBoard(root, llama_server, tiny_model)
    team = Team(board, root)
    team.port = port_range("gateway", 10)[0] + port
    team.url = f"http://127.0.0.1:{team.port}"
    board.agent.config.write_text(board.agent.config.read_text() + config.replace("{listen}", f"127.0.0.1:{team.port}")
                                 .replace("{model}", str(board.model)))
    board.agent.start()
    team.server = team.serve("alice", 2)
    team.start_gateway()
    assert wait_for(lambda: ALIAS in team.models()["models"]), team.log.read_text()
    yield team
    try:
        if team.gateway is not None:
            assert agent_process.stop(team.gateway) == 0, team.log.read_text()
        for server in board.json("carol", "serve", "list")["servers"]:
            board.run("carol", "serve", "stop", str(server["id"]))
    finally:
        board.agent.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def team(llama_server, tiny_model):
    with running_team(llama_server, tiny_model, f'\n[gateway]\nlisten = "{{listen}}"\nmax_body_mb = 1\n'
                                                f'queue_timeout_s = 20\n[gateway.team_aliases]\n'
                                                f'{TEAM_ALIAS} = ["alice", "@{ADMIN_GROUP}"]\n') as team:
        yield team


@pytest.fixture(autouse=True)
def free_cards(request):
    """After each test on the module's team, its servers stop and its bookings end (the team's own server on card 2
    stays): which cards are free must not depend on which tests ran before (the order is random)."""
    yield
    if "team" not in request.fixturenames:
        return
    team = request.getfixturevalue("team")
    for server in team.board.json("carol", "serve", "list")["servers"]:
        if server["id"] != team.server["id"]:
            team.board.ok("carol", "serve", "stop", str(server["id"]))
    for booking in team.board.json("carol", "list")["bookings"]:
        if booking["id"] != team.server["booking_id"]:
            ended = team.board.run("carol", "release", str(booking["id"]))
            if ended.returncode != 0:  # not started yet
                team.board.ok("carol", "cancel", str(booking["id"]))


def test_the_gateway_runs_as_its_own_user_without_capabilities(team):
    status = Path(f"/proc/{team.gateway.pid}/status").read_text()
    uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
    assert uid == __import__("pwd").getpwnam(GATEWAY_USER).pw_uid
    assert next(line for line in status.splitlines() if line.startswith("CapEff:")).split()[1] == "0" * 16
    # It gets the servers' keys and the keys' hashes; a member does not.
    refused = team.board.run("alice", "key", "list")  # (a member's own keys are fine)
    assert refused.returncode == 0
    script = "from app.client.socket import SocketClient as S; import sys; S(sys.argv[1]).call('gateway_state')"
    from tests.service.support import run_as
    result = run_as("bob", str(BOARD.parent / "python"), "-c", script, str(team.board.agent.socket),
                    env={"PATH": "/usr/bin:/bin"})
    assert result.returncode != 0 and "NotPermitted" in result.stderr and "gateway_state" in result.stderr


def test_the_openai_client_sync_async_plain_and_streamed(team):
    key = team.key("alice", "--name", "laptop", "--class", "online")["key"]
    client = team.client(key)
    [model] = [m for m in client.models.list().data if m.id == ALIAS]
    assert model.owned_by == "alice" and model.model_extra["board"]["servers"] == [team.server["id"]]

    plain = client.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "hello"}], max_tokens=8)
    assert plain.usage.completion_tokens > 0 and plain.choices[0].message is not None

    # Streamed, event for event what the server itself sends (greedy, so the same each time: how many events a
    # handful of tokens make depends on the tiny model's bytes, so only the server can say).
    ask = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0, "stream": True}
    direct = openai.OpenAI(base_url=f"http://127.0.0.1:{team.server['port']}/v1", api_key=team.server["api_key"],
                           max_retries=0, timeout=60)
    relayed = list(client.chat.completions.create(model=ALIAS, **ask))
    assert deltas(relayed) == deltas(direct.chat.completions.create(model=ALIAS, **ask))
    assert [c.choices[0].finish_reason for c in relayed if c.choices][-1] == "length"

    completion = client.completions.create(model=ALIAS, prompt="once upon", max_tokens=6)
    assert completion.usage.completion_tokens > 0

    async def both_ways():
        client = openai.AsyncOpenAI(base_url=f"{team.url}/v1", api_key=key, max_retries=0, timeout=60)
        async with client:
            answer = await client.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "a"}],
                                                          max_tokens=4)
            stream = await client.chat.completions.create(model=ALIAS, **{**ask, "max_tokens": 4})
            pieces = [chunk async for chunk in stream]
        return answer, pieces

    answer, pieces = asyncio.run(both_ways())
    assert answer.usage.completion_tokens > 0
    assert deltas(pieces) == deltas(direct.chat.completions.create(model=ALIAS, **{**ask, "max_tokens": 4}))


def deltas(chunks) -> list:
    """A stream's events as the client parsed them: each one's new text, or its finish."""
    return [(c.choices[0].delta.content, c.choices[0].finish_reason) for c in chunks if c.choices]


def test_curl_sees_server_sent_events_chunk_by_chunk(team):
    key = team.key("alice")["key"]
    body = json.dumps({"model": ALIAS, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                       "stream": True})
    out = subprocess.run(["curl", "-sS", "-N", "-i", f"{team.url}/v1/chat/completions", "-H",
                          f"Authorization: Bearer {key}", "-H", "Content-Type: application/json", "-d", body],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    head, _, events = out.stdout.partition("\n\n")  # (text mode: the header lines end in \n)
    assert "text/event-stream" in head and "Content-Length" not in head
    data = [line for line in events.splitlines() if line.startswith("data: ")]
    assert len(data) >= 2 and data[-1] == "data: [DONE]" and '"choices"' in data[0], out.stdout


def test_every_error_in_openais_format(team):
    alice = team.key("alice")["key"]
    scoped = team.key("bob", "--models", "other-model")["key"]
    chat = {"model": ALIAS, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}

    status, _, body = http(f"{team.url}/v1/chat/completions", chat)
    assert status == 401 and body["error"]["code"] == "invalid_api_key" and "board key new" in body["error"]["message"]
    status, _, body = http(f"{team.url}/v1/chat/completions", chat, key="bk-not-a-key")
    assert status == 401
    status, _, body = http(f"{team.url}/v1/chat/completions", chat, key=scoped)
    assert status == 403 and "other-model" in body["error"]["message"] and body["error"]["type"]
    status, _, body = http(f"{team.url}/v1/chat/completions", {**chat, "model": "nobody-serves-this"}, key=alice)
    assert status == 404 and ALIAS in body["error"]["message"] and body["error"]["code"] == "model_not_found"
    status, _, body = http(f"{team.url}/v1/chat/completions", b"{" + b" " * (2 << 20) + b"}", key=alice)
    assert status == 413 and "max_body_mb" in body["error"]["message"]
    with pytest.raises(openai.AuthenticationError):
        team.client("bk-wrong").chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.NotFoundError):
        team.client(alice).chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def test_a_planned_model_is_503_with_its_start_until_the_plan_is_cancelled(team):
    """A model planned for later (serve plan) is not a typo: 503, Retry-After until its start, the booking named;
    cancelled, it is unknown again (404). The plan reaches the gateway by the service's push."""
    from datetime import datetime, timedelta, timezone

    start = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(hours=2)
    booking = team.board.json("alice", "book", "--cards", "6", "--start", start.isoformat(), "--for", "1h")["id"]
    plan = team.board.json("alice", "serve", "plan", str(booking), "--model", str(team.board.model), "--ctx", "256",
                           "--alias", "later-llm")
    key = team.key("bob")["key"]
    chat = {"model": "later-llm", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    assert wait_for(lambda: http(f"{team.url}/v1/chat/completions", chat, key=key)[0] == 503, timeout=5)
    status, head, body = http(f"{team.url}/v1/chat/completions", chat, key=key)
    assert body["error"]["code"] == "model_not_ready" and f"(booking {booking})" in body["error"]["message"]
    assert "served from" in body["error"]["message"]
    assert head["Retry-After"] == "3600", head  # two hours away: capped at an hour, then asked again
    team.board.ok("alice", "serve", "plan", "--cancel", str(plan["id"]))
    assert wait_for(lambda: http(f"{team.url}/v1/chat/completions", chat, key=key)[0] == 404, timeout=5)
    team.board.ok("alice", "cancel", str(booking))


def test_a_key_revoked_mid_use_stops_within_5_s(team):
    made = team.key("alice", "--name", "to-revoke")
    chat = {"model": ALIAS, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    assert http(f"{team.url}/v1/chat/completions", chat, key=made["key"])[0] == 200
    team.board.ok("alice", "key", "revoke", str(made["id"]))
    revoked_at = time.monotonic()
    assert wait_for(lambda: http(f"{team.url}/v1/chat/completions", chat, key=made["key"])[0] == 401, timeout=5)
    assert time.monotonic() - revoked_at <= 5


def slots_busy(server: dict) -> list[bool]:
    status, _, body = http(f"http://127.0.0.1:{server['port']}/slots", key=server["api_key"])
    assert status == 200, body
    return [bool(s.get("is_processing")) for s in body]


def test_a_client_that_leaves_mid_stream_frees_the_slot(team):
    # A context of 32k tokens: the tiny model writes a few thousand a second, so the stream is still running when the
    # client leaves (with the shared server's 256 tokens a slot it ended by itself before /slots was asked).
    server = team.serve("alice", 4, alias="long-llm", ctx=32768, parallel=1)
    key = team.key("alice")["key"]
    body = json.dumps({"model": "long-llm", "messages": [{"role": "user", "content": "tell a long story"}],
                       "max_tokens": 100000, "stream": True, "ignore_eos": True}).encode()
    sock = socket.create_connection(("127.0.0.1", team.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + key.encode() + b"\r\nContent-Length: " + str(len(body)).encode()
                 + b"\r\n\r\n" + body)
    received = b""
    while received.count(b"data: ") < 3:
        received += sock.recv(65536)
    # Asked while the client still reads: /slots may answer between two of the slot's steps on a loaded machine.
    assert wait_for(lambda: any(slots_busy(server)), timeout=5), "the stream's slot should be busy"
    sock.close()
    left = time.monotonic()
    assert wait_for(lambda: not any(slots_busy(server)), timeout=5)
    assert time.monotonic() - left <= 1.5, "the upstream slot stayed busy after the client left"
    team.board.ok("alice", "serve", "stop", str(server["id"]))


def test_accounting_matches_what_llama_server_reported(team):
    made = team.key("carol", "--name", "accounting")
    client = team.client(made["key"])
    reported = []
    for n in (3, 5):
        answer = client.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "count"}],
                                                max_tokens=n)
        reported.append((answer.usage.prompt_tokens, answer.usage.completion_tokens))
    stream = client.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "more"}], max_tokens=4,
                                            stream=True, stream_options={"include_usage": True})
    last = [chunk for chunk in stream if chunk.usage is not None][-1]
    reported.append((last.usage.prompt_tokens, last.usage.completion_tokens))

    def mine():
        return [r for r in team.usage_rows() if r[0] == made["id"]]

    assert wait_for(lambda: len(mine()) == 3), team.log.read_text()
    assert [(r[3], r[4]) for r in mine()] == reported
    assert {r[2] for r in mine()} == {200}
    doc = team.board.json("carol", "usage", "--by", "key")
    [row] = [r for r in doc["rows"] if r["key"] == made["fingerprint"]]
    assert (row["requests"], row["prompt_tokens"], row["completion_tokens"], row["errors"]) == (
        3, sum(p for p, _ in reported), sum(c for _, c in reported), 0)
    metrics = urllib.request.urlopen(f"{team.url}/metrics", timeout=5).read().decode()
    assert f'board_gateway_requests_total{{code="200",model="{ALIAS}",user="carol"}} 3.0' in metrics
    assert "board_gateway_request_duration_seconds_bucket" in metrics


def test_two_servers_with_one_alias_share_the_load(team):
    second = team.serve("alice", 3)  # one holder's (another member's is refused: the next tests)
    assert wait_for(lambda: team.models()["servers"] == 2), team.log.read_text()
    key = team.key("alice")["key"]

    async def crowd():
        client = openai.AsyncOpenAI(base_url=f"{team.url}/v1", api_key=key, max_retries=0, timeout=120)
        async with client:
            return await asyncio.gather(*(client.chat.completions.create(
                model=ALIAS, messages=[{"role": "user", "content": f"n{i}"}], max_tokens=16) for i in range(4)))

    before = len(team.usage_rows())
    # The first server is held still, so whatever it is sent stays in flight (the tiny model otherwise answers each
    # request before the next arrives, and all four went to it): the next ones go to the less busy second server.
    os.kill(team.server["pid"], signal.SIGSTOP)
    try:
        crowding = threading.Thread(target=lambda: results.append(asyncio.run(crowd())))
        results: list = []
        crowding.start()
        assert wait_for(lambda: len(team.usage_rows()) >= before + 2), team.log.read_text()
    finally:
        os.kill(team.server["pid"], signal.SIGCONT)
    crowding.join(timeout=120)
    (answers,) = results
    assert all(a.usage.completion_tokens > 0 for a in answers)
    assert wait_for(lambda: len(team.usage_rows()) >= before + 4)
    servers = [r[1] for r in team.usage_rows()[before:]]
    assert set(servers) == {team.server["id"], second["id"]}, servers
    team.board.ok("alice", "serve", "stop", str(second["id"]))
    assert wait_for(lambda: team.models()["servers"] == 1)


def waiting(team) -> float:
    """The gateway's requests waiting for a slot now (its /metrics)."""
    text = urllib.request.urlopen(f"{team.url}/metrics", timeout=5).read().decode()
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith("board_gateway_waiting_requests "))


def test_one_members_crowd_does_not_keep_out_another_who_comes_later(team):
    """Issue 31, replayed: bob kept 8 requests in flight and every one of carol's waited behind them until it was
    refused 429. Both batch, through the real openai client: carol's one request, sent after bob's eight wait, is
    served at the next free slot, before the rest of bob's."""
    server = team.serve("alice", 5, alias="fair-llm", parallel=2)
    keys = {user: team.key(user, "--class", "batch") for user in ("bob", "carol")}
    chat = {"model": "fair-llm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    async def crowd():
        client = openai.AsyncOpenAI(base_url=f"{team.url}/v1", api_key=keys["bob"]["key"], max_retries=0, timeout=120)
        async with client:
            return await asyncio.gather(*(client.chat.completions.create(**chat) for _ in range(8)))

    answers: dict = {}
    before = len(team.usage_rows())
    # The server is held still, so bob's first two stay in flight and his other six wait at the gateway.
    os.kill(server["pid"], signal.SIGSTOP)
    try:
        crowding = threading.Thread(target=lambda: answers.update(bob=asyncio.run(crowd())))
        crowding.start()
        assert wait_for(lambda: waiting(team) == 6), team.log.read_text()
        later = threading.Thread(target=lambda: answers.update(carol=team.client(keys["carol"]["key"]).chat.completions
                                                               .create(**chat)))
        later.start()
        assert wait_for(lambda: waiting(team) == 7), team.log.read_text()
    finally:
        os.kill(server["pid"], signal.SIGCONT)
    crowding.join(timeout=120)
    later.join(timeout=120)
    assert len(answers["bob"]) == 8 and all(a.usage.completion_tokens > 0 for a in [*answers["bob"], answers["carol"]])
    assert wait_for(lambda: len(team.usage_rows()) >= before + 9), team.log.read_text()
    served = ["carol" if r[0] == keys["carol"]["id"] else "bob" for r in team.usage_rows()[before:]]
    assert {r[2] for r in team.usage_rows()[before:]} == {200}
    # In the order the gateway finished them: carol's took the first slot that came free, alongside bob's third
    # (first come would have put her ninth, after all of bob's).
    assert served.count("bob") == 8 and served.index("carol") <= 3, served
    team.board.ok("alice", "serve", "stop", str(server["id"]))


def test_bob_cannot_serve_under_the_alias_alices_server_serves_now_or_is_planned_to(team):
    """The attack (issue 31, section 2): bob started a server under the alias alice's server served, and the gateway
    split carol's requests between the two: her prompts reached bob's log and he chose her answers. As bob, over the
    real socket: refused, exit 3, naming the holder and her booking; nothing of his is started or routed to."""
    from datetime import datetime, timedelta, timezone

    bobs = team.board.json("bob", "book", "--cards", "5", "--for", "2h")["id"]
    serve = ("serve", "start", str(bobs), "--model", str(team.board.model), "--ctx", "256")
    refused = team.board.run("bob", *serve, "--alias", ALIAS)
    assert refused.returncode == 3, refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert f"alias {ALIAS} is alice's: their server {team.server['id']} on booking {team.server['booking_id']}" \
        in line, line
    assert "bob" not in [s["user"] for s in team.board.json("carol", "serve", "list")["servers"]]
    carol = team.client(team.key("carol")["key"])
    [model] = [m for m in carol.models.list().data if m.id == ALIAS]
    assert model.owned_by == "alice" and model.model_extra["board"]["servers"] == [team.server["id"]]

    # Planned: alice's server for a booking from an hour on. bob's start now, on a booking that runs two hours, and
    # a plan of his for that booking, are refused alike.
    start = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(hours=1)
    alices = team.board.json("alice", "book", "--cards", "7", "--start", start.isoformat(), "--for", "1h")["id"]
    plan = team.board.json("alice", "serve", "plan", str(alices), "--model", str(team.board.model), "--alias",
                           "alice-team")
    for refused in (team.board.run("bob", *serve, "--alias", "alice-team"),
                    team.board.run("bob", "serve", "plan", str(bobs), "--model", str(team.board.model), "--alias",
                                   "alice-team")):
        assert refused.returncode == 3, refused.stderr
        [line] = refused.stderr.strip().splitlines()
        assert f"alias alice-team is alice's: their planned server {plan['id']} serves it on booking {alices}" \
            in line, line
    assert [p["user"] for p in team.board.json("bob", "serve", "plan", "--list")["plans"]] == ["alice"]
    team.board.ok("alice", "serve", "plan", "--cancel", str(plan["id"]))
    team.board.ok("alice", "cancel", str(alices))
    team.board.ok("bob", "cancel", str(bobs))


def test_a_team_alias_is_served_by_the_members_it_lists_and_refused_to_the_others(team):
    """[gateway.team_aliases] shared-llm = ["alice", "@boardadmins"]: alice by name and carol as a member of the
    admins' group serve it together, and the gateway routes to both; bob, not listed, is refused (exit 4, naming who
    may). /v1/models names the team's owners."""
    alices = team.serve("alice", 0, alias=TEAM_ALIAS, ctx=256, parallel=1)
    carols = team.serve("carol", 1, alias=TEAM_ALIAS, ctx=256, parallel=1)
    bobs = team.board.json("bob", "book", "--cards", "5", "--for", "1h")["id"]
    refused = team.board.run("bob", "serve", "start", str(bobs), "--model", str(team.board.model), "--alias",
                             TEAM_ALIAS)
    assert refused.returncode == 4, refused.stderr
    assert refused.stderr.strip().splitlines() == [
        f"board: {TEAM_ALIAS} is a team alias that only alice, @{ADMIN_GROUP} may serve ([gateway.team_aliases]);"
        " give another --alias"], refused.stderr
    key = team.key("bob")["key"]
    assert wait_for(lambda: [m for m in team.client(key).models.list().data if m.id == TEAM_ALIAS
                             and len(m.model_extra["board"]["servers"]) == 2]), team.log.read_text()
    [model] = [m for m in team.client(key).models.list().data if m.id == TEAM_ALIAS]
    assert model.owned_by == f"alice,@{ADMIN_GROUP}"
    assert model.model_extra["board"]["servers"] == sorted([alices["id"], carols["id"]])
    answer = team.client(key).chat.completions.create(model=TEAM_ALIAS, messages=[{"role": "user", "content": "x"}],
                                                      max_tokens=2)
    assert answer.usage.completion_tokens > 0
    team.board.ok("alice", "serve", "stop", str(alices["id"]))
    team.board.ok("carol", "serve", "stop", str(carols["id"]))
    team.board.ok("bob", "cancel", str(bobs))


@pytest.fixture
def bare(llama_server, tiny_model):
    """The agent and the gateway, no server: for what a restart of the service does to the gateway."""
    needs_root()
    ensure_unix_users()
    ensure_system_user(GATEWAY_USER, MEMBERS_GROUP)
    root = scratch_dir("board-gateway-restart-")
    board = SharedBoard(root, llama_server, tiny_model)
    team = Team(board, root)
    team.port = port_range("gateway", 10)[0] + 1
    team.url = f"http://127.0.0.1:{team.port}"
    config = board.agent.config
    config.write_text(config.read_text() + f'\n[gateway]\nlisten = "127.0.0.1:{team.port}"\n')
    board.agent.start()
    team.start_gateway()
    yield team
    try:
        assert agent_process.stop(team.gateway) == 0, team.log.read_text()
    finally:
        board.agent.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_the_gateway_follows_the_service_across_a_kill_and_a_restart(bare):
    before = bare.key("alice")
    models = f"{bare.url}/v1/models"
    assert wait_for(lambda: http(models, key=before["key"])[0] == 200, timeout=5)
    bare.board.agent.kill9()
    # The gateway keeps serving on what it knew; what it counts meanwhile waits for the service.
    assert http(models, key=before["key"])[0] == 200
    chat = {"model": "nobody", "messages": [{"role": "user", "content": "x"}]}
    assert http(f"{bare.url}/v1/chat/completions", chat, key=before["key"])[0] == 404
    bare.board.agent.start()
    after = bare.key("bob")  # made after the restart: the gateway re-read the state when it reconnected
    assert wait_for(lambda: http(models, key=after["key"])[0] == 200, timeout=5), bare.log.read_text()
    assert wait_for(lambda: [r for r in bare.usage_rows() if r[0] == before["id"]]), bare.log.read_text()
    assert bare.gateway.poll() is None


TRAVERSALS = ["/v1/../slots", "/v1/../props", "/v1/%2e%2e/props", "/v1/..%2fprops", "/v1/./../props",
              "/v1//../../slots"]


def test_llama_servers_own_routes_are_out_of_reach_by_every_spelling_of_a_way_around(team):
    """curl --path-as-is sends each path as written (no client-side normalising); the gateway answers 404 in OpenAI's
    shape and relays none of them (its log names no server for any)."""
    key = team.key("bob")["key"]
    requests = [("GET", path) for path in TRAVERSALS] + [
        ("POST", "/v1/../slots/0?action=erase"), ("POST", "/v1/%2e%2e/slots/0?action=erase"),
        ("POST", "/v1/chat/completions/../../slots/0?action=erase")]
    before = team.log.read_text().count("\n")
    for method, path in requests:
        out = subprocess.run(["curl", "-sS", "--path-as-is", "-X", method, "-o", "-", "-w", "\n%{http_code}",
                              f"{team.url}{path}", "-H", f"Authorization: Bearer {key}", "-H",
                              "Content-Type: application/json", "-d", json.dumps({"model": ALIAS})],
                             capture_output=True, text=True, timeout=30)
        body, _, code = out.stdout.rpartition("\n")
        assert code == "404", (path, out.stdout, out.stderr)
        assert json.loads(body)["error"]["code"] == "not_found", path
    logged = team.log.read_text().splitlines()[before:]
    assert not any("server=" in line and "server=-" not in line for line in logged), logged


def test_a_server_whose_llama_server_died_leaves_the_routing_within_5_s(team):
    server = team.serve("alice", 5, alias="dies-llm", parallel=1)
    key = team.key("alice")["key"]
    chat = {"model": "dies-llm", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    assert wait_for(lambda: http(f"{team.url}/v1/chat/completions", chat, key=key)[0] == 200, timeout=5)
    os.kill(server["pid"], signal.SIGKILL)
    killed = time.monotonic()
    assert wait_for(lambda: "dies-llm" not in team.models()["models"], timeout=10), team.log.read_text()[-3000:]
    assert time.monotonic() - killed <= 5
    status, _, body = http(f"{team.url}/v1/chat/completions", chat, key=key)
    assert status == 404 and body["error"]["code"] == "model_not_found", body


def sse_docs(url: str, body: dict, key: str) -> list[dict]:
    """The JSON of each `data:` line of a streamed answer, read raw (what a client of the Anthropic or Responses API
    sees), [DONE] left out."""
    request = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert "event-stream" in response.headers["Content-Type"]
        lines = response.read().decode().splitlines()
    return [json.loads(line[5:]) for line in lines if line.startswith("data:") and line[5:].strip() != "[DONE]"]


def test_responses_messages_and_a_timings_only_stream_are_accounted_as_llama_server_reported_them(team):
    """/v1/responses and /v1/messages, plain and streamed, and a chat stream that says its tokens only in its
    timings, through the gateway to the real llama-server: the
    service's gateway_usage rows hold the tokens the server's answers said, cached prompt tokens included (each
    prompt is asked twice, so the second answer reads most of it from the cache).
    Nearest wrong versions:
    - only `usage.prompt_tokens/completion_tokens` read: these answers accounted 0 + 0
    - Anthropic's input_tokens alone: the cached prompt tokens (cache_read_input_tokens) left out
    - message_delta's usage (output only) taken whole: the stream's prompt reset to 0
    - timings' prompt_n alone: the chat stream's cached prompt tokens (cache_n) left out"""
    made = team.key("carol", "--name", "shapes")
    reported = []
    for _ in range(2):
        status, _, answer = http(f"{team.url}/v1/responses", {"model": ALIAS, "input": "count",
                                                                "max_output_tokens": 3}, made["key"])
        assert status == 200, answer
        reported.append((answer["usage"]["input_tokens"], answer["usage"]["output_tokens"]))
    docs = sse_docs(f"{team.url}/v1/responses", {"model": ALIAS, "input": "count", "max_output_tokens": 2},
                    made["key"])
    [done] = [d["response"]["usage"] for d in docs if d.get("type") == "response.completed"]
    reported.append((done["input_tokens"], done["output_tokens"]))
    asked = {"model": ALIAS, "messages": [{"role": "user", "content": "more"}], "max_tokens": 3}
    for _ in range(2):
        status, _, answer = http(f"{team.url}/v1/messages", asked, made["key"])
        assert status == 200, answer
        usage = answer["usage"]
        reported.append((usage["input_tokens"] + usage.get("cache_read_input_tokens", 0), usage["output_tokens"]))
    docs = sse_docs(f"{team.url}/v1/messages", {**asked, "max_tokens": 2}, made["key"])
    # llama-server sends message_start with the first token it streams; when that token is part of a UTF-8 character
    # it holds it back, and the stream starts at message_delta: the prompt goes unsaid (tests/unit/test_gateway_meter.py
    # has both shapes).
    start = next((d["message"]["usage"] for d in docs if d.get("type") == "message_start"), {"input_tokens": 0})
    [delta] = [d["usage"] for d in docs if d.get("type") == "message_delta"]
    reported.append((start["input_tokens"] + start.get("cache_read_input_tokens", 0), delta["output_tokens"]))
    # A chat stream without stream_options.include_usage: only the last chunk's timings say it (prompt_n: uncached).
    docs = sse_docs(f"{team.url}/v1/chat/completions", {**asked, "max_tokens": 2}, made["key"])
    [timings] = [d["timings"] for d in docs if "timings" in d]
    assert not [d for d in docs if d.get("usage")]
    reported.append((timings["prompt_n"] + timings["cache_n"], timings["predicted_n"]))
    assert all(p > 0 and c > 0 for p, c in reported[:5] + reported[6:]), reported
    assert usage.get("cache_read_input_tokens", 0) > 0 and timings["cache_n"] > 0  # prompts read from the cache

    def mine():
        return [r for r in team.usage_rows() if r[0] == made["id"]]

    assert wait_for(lambda: len(mine()) == 7), team.log.read_text()
    assert [(r[3], r[4]) for r in mine()] == reported
    assert {r[2] for r in mine()} == {200}
