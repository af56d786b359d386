"""The gateway's budgets and rate limits end to end: the real agent with two projects (A: alice, 1 token a day; B:
bob and carol, no budget), [gateway] key_rpm = 3, [policy] timezone Asia/Tokyo (not the system's UTC), a real CPU
llama-server that alice serves, the gateway as its unit runs it, and the official `openai` client.

The clock is the real one here (the gateway is another process): the assertions bound Retry-After by the times
before and after the request, never by how long anything took. The same rules on a pinned clock, each boundary:
tests/unit/test_gateway_limits.py.
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from tests.llama.test_gateway import ALIAS, running_team, wait_for
from tests.shared_install import read_rows

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.real_users, pytest.mark.usefixtures("_subreaper")]
ZONE = ZoneInfo("Asia/Tokyo")


@pytest.fixture(scope="module")
def team(llama_server, tiny_model):
    with running_team(llama_server, tiny_model, '\n[policy]\ntimezone = "Asia/Tokyo"\n\n'
                                                '[gateway]\nlisten = "{listen}"\nkey_rpm = 3\n\n'
                                                '[[projects]]\nname = "A"\nmembers = ["alice"]\ntokens_per_day = 1\n\n'
                                                '[[projects]]\nname = "B"\nmembers = ["bob", "carol"]\n',
                      port=2) as team:  # beside test_gateway.py's two gateways, should both modules' be up
        yield team


def ask(client):
    return client.chat.completions.create(model=ALIAS, messages=[{"role": "user", "content": "hi"}], max_tokens=4)


def next_midnight(now: float) -> int:
    today = datetime.fromtimestamp(now, ZONE).replace(hour=0, minute=0, second=0, microsecond=0)
    return int((today + timedelta(days=1)).timestamp())


def test_a_projects_spent_day_is_429_with_retry_after_at_its_zones_midnight_and_the_other_project_goes_on(team):
    """alice's key is for A (her only project). Her first request is answered and spends A's 1 token for the day;
    the next is the openai client's RateLimitError, OpenAI's error shape naming the project, Retry-After the seconds
    to Tokyo's next midnight. carol's key (B, no budget) is answered on the same server after it. The service's
    accounting rows carry each key's project.
    Wrong versions: the budget not enforced, Retry-After to the system's (UTC) midnight (9 h apart) or none,
    A's tokens counted against B (carol refused), the records without their project."""
    alice = team.key("alice")
    assert alice["project"] == "A"
    client = team.client(alice["key"])
    assert ask(client).usage.total_tokens > 0
    before = time.time()
    with pytest.raises(openai.RateLimitError) as refused:
        ask(client)
    after = time.time()
    error = refused.value
    assert error.code == "project_tokens_per_day" and error.type == "rate_limit_exceeded"
    assert error.body["message"].startswith("project A has used ") and "Asia/Tokyo" in error.body["message"]
    retry = int(error.response.headers["Retry-After"])
    assert next_midnight(after) - after <= retry <= math.ceil(next_midnight(before) - before)
    carol = team.key("carol")
    assert carol["project"] == "B"
    assert ask(team.client(carol["key"])).usage.total_tokens > 0
    rows = wait_for(lambda: len(found := read_rows(team.board.agent.db, "SELECT key_id, project, status FROM"
                                                                        " gateway_usage ORDER BY id")) >= 3 and found)
    assert rows == [(alice["id"], "A", 200), (alice["id"], "A", 429), (carol["id"], "B", 200)]


def test_a_keys_fourth_request_in_a_minute_is_429_and_another_key_of_the_same_member_is_not_held(team):
    """[gateway] key_rpm 3: bob's key gets three answers, the fourth is RateLimitError with Retry-After at most a
    minute; bob's second key is answered (the limit is per key, not per member or project).
    Wrong versions: the limit off by one (the 4th answered, or the 3rd refused), counted per member or project."""
    bob = team.client(team.key("bob")["key"])
    for _ in range(3):
        assert ask(bob).usage.total_tokens > 0
    with pytest.raises(openai.RateLimitError) as refused:
        ask(bob)
    assert refused.value.code == "key_requests_per_minute"
    assert 1 <= int(refused.value.response.headers["Retry-After"]) <= 60
    assert ask(team.client(team.key("bob", "--name", "second")["key"])).usage.total_tokens > 0
