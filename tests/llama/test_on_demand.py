"""Models on demand end to end: the real agent (user board) with a catalog ([[models]]), the real runner (setpriv
board-llama), the real gateway (user board-gateway) and the official `openai` client, on the simulated fleet.

The catalog: tiny-llm (pool demand: card 3) falls back to spare-llm (pool spare: card 4), both the tests' tiny GGUF,
billed to project search, ttl_s 8 with [gateway] drain_s 1: idle for 8 s, a server stops within a few more. Each
test starts with both cold. The clock is the real one (three processes): times are bounded by what was read before
and after, never by how long anything took. The gateway's logic on a pinned clock, each boundary:
tests/unit/test_gateway_demand.py; the service's: tests/service/test_on_demand_service.py.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from tests.llama.test_gateway import deltas, http, running_team, wait_for
from tests.llama.test_servers_service import start_runner

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.real_users, pytest.mark.usefixtures("_subreaper")]
# ttl_s 8, not less: a lease grows only by steps of 5 s or more (app.service.rules.bookings LEASE_MIN_STEP_SECONDS),
# so an alias in use is 6 s from its last step at worst, and must still be more than drain_s from its end then.
TTL_S, DRAIN_S = 8, 1
CATALOG = ("tiny-llm", "spare-llm")
CONFIG = f"""
[gateway]
listen = "{{listen}}"
drain_s = {DRAIN_S}
queue_timeout_s = 20

[[projects]]
name = "search"
members = ["alice", "bob", "carol"]

[[pools]]
name = "demand"
cards = [3]

[[pools]]
name = "spare"
cards = [4]

[[models]]
alias = "tiny-llm"
model = "{{model}}"
ctx = 256
parallel = 2
pool = "demand"
project = "search"
ttl_s = {TTL_S}
fallbacks = ["spare-llm"]

[[models]]
alias = "spare-llm"
model = "{{model}}"
ctx = 256
pool = "spare"
project = "search"
ttl_s = {TTL_S}
"""
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def team(llama_server, tiny_model):
    with running_team(llama_server, tiny_model, CONFIG, port=3) as team:  # beside the other gateway modules' ports
        team.runner = start_runner(team.board)
        try:
            yield team
        finally:
            team.runner.terminate()
            team.runner.wait(15)


@pytest.fixture(autouse=True)
def cold(team):
    """Each test starts with the catalog cold: the members' bookings a test made are ended, and every on-demand
    booking and server is over (idle: ttl_s + drain_s, then the enforcement's stop)."""
    yield
    for booking in team.board.json("carol", "list")["bookings"]:
        if booking["user"] in ("alice", "bob") and booking["id"] != team.server["booking_id"]:
            if team.board.run("carol", "release", str(booking["id"])).returncode != 0:  # not started yet
                team.board.ok("carol", "cancel", str(booking["id"]))
    assert wait_for(lambda: not on_demand(team) and not live_servers(team), timeout=60), (
        on_demand(team), live_servers(team), team.runner.log.read_text()[-2000:])


def on_demand(team, alias: str | None = None) -> list[dict]:
    """The on-demand bookings from now on (board list, as carol, an admin)."""
    return [b for b in team.board.json("carol", "list")["bookings"]
            if (b.get("request") or {}).get("on_demand") in ((alias,) if alias else CATALOG)]


def servers(team, alias: str) -> list[dict]:
    return [s for s in team.board.json("carol", "serve", "list", "--all")["servers"] if s["alias"] == alias]


def live_servers(team) -> list[dict]:
    return [s for alias in CATALOG for s in servers(team, alias) if s["state"] in ("starting", "ready", "stopping")]


class KeptBusy(threading.Thread):
    """Requests for `alias`, one after another until stopped, so that it is in use throughout (its ttl_s is short):
    each one's (model that answered, or the HTTP status of its refusal, with the refusal)."""

    def __init__(self, client, alias: str) -> None:
        super().__init__(daemon=True)
        self.client, self.alias = client, alias
        self.answers: list[tuple[str | int, object]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                answer = self.client.chat.completions.create(model=self.alias, messages=HI, max_tokens=2)
                self.answers.append((answer.model, answer))
            except openai.APIStatusError as refused:
                self.answers.append((refused.status_code, refused))
            self.stopping.wait(0.2)

    def __enter__(self) -> KeptBusy:
        self.start()
        assert wait_for(lambda: self.answers, timeout=120), "no answer"
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.join(60)


def metric(team, name: str, alias: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    status, _, text = http(f"{team.url}/metrics")
    assert status == 200
    return next((s.value for f in text_string_to_metric_families(text) for s in f.samples
                 if s.name == name and s.labels.get("model") == alias), 0.0)


def test_a_cold_alias_is_listed_then_answered_and_board_list_shows_its_booking_under_the_catalogs_project(team):
    """/v1/models lists tiny-llm cold; the openai client's request starts it (one cold start, timed) and is
    answered; `board list` shows the runner account's booking on card 3 for project search, and the server is the
    runner's. Wrong versions: the cold alias 404 (the gateway ignoring the catalog) or unlisted; the booking under
    no project or the asking member's name."""
    client = team.client(team.key("alice")["key"])
    [listed] = [m for m in client.models.list().data if m.id == "tiny-llm"]
    assert listed.model_extra["board"]["on_demand"] is True and listed.model_extra["board"]["state"] == "cold"
    starts = metric(team, "board_gateway_cold_starts_total", "tiny-llm")
    timed = metric(team, "board_gateway_cold_start_seconds_count", "tiny-llm")

    answer = client.chat.completions.create(model="tiny-llm", messages=HI, max_tokens=4)
    assert answer.usage.completion_tokens > 0 and answer.choices[0].message is not None
    with KeptBusy(client, "tiny-llm") as busy:  # in use while it is looked at
        [booking] = on_demand(team, "tiny-llm")
        assert (booking["user"], booking["cards"], booking["project"], booking["note"]) == (
            "board-llama", [3], "search", "on demand: tiny-llm")
        line = next(line for line in team.board.ok("alice", "list").stdout.splitlines()
                    if line.startswith(f"#{booking['id']} "))
        assert "board-llama (project search)" in line and "on demand: tiny-llm" in line
        [server] = [s for s in servers(team, "tiny-llm") if s["state"] == "ready"]
        assert server["booking_id"] == booking["id"]
        [listed] = [m for m in client.models.list().data if m.id == "tiny-llm"]
        assert listed.model_extra["board"]["state"] == "ready" and listed.model_extra["board"]["cards"] == [3]
    assert {model for model, _ in busy.answers} == {"tiny-llm"}, (team.log.read_text()[-3000:],
                                                                  team.board.agent.log_text()[-3000:])
    assert metric(team, "board_gateway_cold_starts_total", "tiny-llm") == starts + 1
    assert metric(team, "board_gateway_cold_start_seconds_count", "tiny-llm") == timed + 1


def test_a_cold_alias_streamed_gets_the_starting_comment_then_the_stream_and_two_clients_start_one_server(team):
    """curl streams a request for the cold alias: its head and `: board: starting tiny-llm on card 3` come while
    the server starts; the openai client's streamed request, sent meanwhile, and curl's both get whole streams; one
    booking, one server. Wrong versions: the head held until the server is ready (curl's first line is data); the
    comment breaking the openai client's parse. (The service makes one booking of concurrent demands by itself: the
    gateway's one call per alias is tests/unit/test_gateway_demand.py's.)"""
    key = team.key("bob")["key"]
    before = max(b["id"] for b in team.board.json("carol", "list", "--all")["bookings"])
    body = json.dumps({"model": "tiny-llm", "messages": HI, "max_tokens": 4, "stream": True})
    curl = subprocess.Popen(["curl", "-sS", "-N", f"{team.url}/v1/chat/completions", "-H", f"Authorization: Bearer {key}",
                             "-H", "Content-Type: application/json", "-d", body],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert curl.stdout is not None
    first = curl.stdout.readline()  # the comment, before any server is ready
    assert first == ": board: starting tiny-llm on card 3\n", first
    pieces: list = []
    other = threading.Thread(target=lambda: pieces.extend(team.client(key).chat.completions.create(
        model="tiny-llm", messages=HI, max_tokens=4, stream=True)))
    other.start()
    out, err = curl.communicate(timeout=120)
    other.join(120)
    data = [line for line in out.splitlines() if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]" and '"choices"' in data[0], (out, err)
    assert deltas(pieces)[-1][1] == "length" and any(text for text, _ in deltas(pieces))
    [booking] = [b for b in team.board.json("carol", "list", "--all")["bookings"]
                 if b["id"] > before and (b.get("request") or {}).get("on_demand") == "tiny-llm"]
    assert len([s for s in servers(team, "tiny-llm") if s["booking_id"] == booking["id"]]) == 1


def test_idle_for_ttl_s_its_server_stops_and_its_booking_is_over(team):
    """After the last answer nothing asks: ttl_s later the gateway stops routing to it, drain_s after that the
    enforcement stops the server at its booking's end, and the calendar has the card back. Wrong versions: the
    lease never renewed (the server stopped under a request) or renewed forever (never stopped); the booking
    ended before ttl_s had passed since the last answer."""
    client = team.client(team.key("carol")["key"])
    for _ in range(3):
        assert client.chat.completions.create(model="tiny-llm", messages=HI, max_tokens=2).usage.completion_tokens
    answered = time.time()
    [booking] = on_demand(team, "tiny-llm")
    [server] = [s for s in servers(team, "tiny-llm") if s["booking_id"] == booking["id"]]
    stopped = team.board.wait_state(server["id"], ("stopped", "crashed"), timeout=60)
    assert stopped["state"] == "stopped" and stopped["reason"] == f"booking {booking['id']} ended", stopped
    ended = next(b for b in team.board.json("carol", "list", "--all")["bookings"] if b["id"] == booking["id"])
    assert datetime.fromisoformat(ended["end"]).timestamp() >= int(answered) + TTL_S
    assert on_demand(team) == []


def test_a_members_booking_two_minutes_ahead_on_its_card_wins(team):
    """bob books card 3 (the on-demand server's) from two minutes ahead: the on-demand booking is cut to end 10 s
    before his, the server is drained and stopped before it, his booking keeps its start, and the next request,
    once tiny-llm is no longer routed, is answered by spare-llm (its "model" says so) or refused 503 with
    Retry-After. Wrong versions: the member's booking refused or moved (the on-demand one blocking it); the
    on-demand server routed or running into his booking."""
    client = team.client(team.key("alice")["key"])
    with KeptBusy(client, "tiny-llm") as busy:  # in use until the gateway stops routing to it
        [server] = [s for s in servers(team, "tiny-llm") if s["state"] == "ready"]
        start = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(minutes=2)
        bobs = team.board.json("bob", "book", "--cards", "3", "--start", start.isoformat(), "--for", "1h")
        assert datetime.fromisoformat(bobs["start"]) == start
        [cut] = on_demand(team, "tiny-llm")
        assert datetime.fromisoformat(cut["end"]) <= start - timedelta(seconds=10)
        # drain_s before its end the gateway stops routing to it: then another answers, or none
        assert wait_for(lambda: busy.answers[-1][0] != "tiny-llm", timeout=180), busy.answers[-3:]
        switched = datetime.now(timezone.utc)
    assert switched < start
    after, refusal = next((model, answer) for model, answer in busy.answers if model != "tiny-llm")
    if after == 503:
        assert refusal.code == "no_free_cards" and int(refusal.response.headers["Retry-After"]) >= 1
    else:
        assert after == "spare-llm", after
    stopped = team.board.wait_state(server["id"], ("stopped", "crashed"), timeout=180)
    assert stopped["state"] == "stopped" and datetime.fromisoformat(stopped["ended"]) < start, stopped
    mine = next(b for b in team.board.json("bob", "list")["bookings"] if b["id"] == bobs["id"])
    assert datetime.fromisoformat(mine["start"]) == start and mine["cards"] == [3]


def test_nothing_free_is_503_with_retry_after_and_the_fallback_answers_once_its_card_is_free(team):
    """alice holds card 3 (tiny-llm's pool), bob card 4 (spare-llm's): a request for tiny-llm is the openai
    client's 503, code no_free_cards, naming tiny-llm's pool and Retry-After in seconds; nothing is booked. bob
    gives card 4 back: the same request is answered by spare-llm, started on card 4, the reply's model saying so.
    Wrong versions: a 404 or a hang; the fallback not tried. (llama-server names its own alias in the reply whatever
    the body said: the body's rewrite is tests/unit/test_gateway_demand.py's.)"""
    for user, card in (("alice", "3"), ("bob", "4")):
        team.board.json(user, "book", "--cards", card, "--for", "1h")
    client = team.client(team.key("alice")["key"])
    with pytest.raises(openai.InternalServerError) as refused:
        client.chat.completions.create(model="tiny-llm", messages=HI, max_tokens=2)
    error = refused.value
    assert error.status_code == 503 and error.code == "no_free_cards" and error.type == "server_error"
    assert error.body["message"].startswith("tiny-llm needs 1 card of pool demand; none are free now"), error.body
    assert 1 <= int(error.response.headers["Retry-After"]) <= 3600
    assert on_demand(team) == []
    bobs = next(b for b in team.board.json("bob", "list")["bookings"] if b["cards"] == [4])
    team.board.ok("bob", "release", str(bobs["id"]))
    answer = client.chat.completions.create(model="tiny-llm", messages=HI, max_tokens=2)
    assert answer.model == "spare-llm" and answer.usage.completion_tokens > 0
    assert [b["cards"] for b in on_demand(team, "spare-llm")] == [[4]] and on_demand(team, "tiny-llm") == []
