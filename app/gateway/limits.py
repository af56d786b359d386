"""The gateway's budgets and rate limits: a project's tokens a day ([[projects]] tokens_per_day), and requests and
tokens a minute per key ([gateway] key_rpm, key_tpm) and per project, its keys together ([[projects]] rpm, tpm).

No HTTP here (app.gateway.server asks before a request is routed, and tells what each answer used), and no lock: it
all runs on the gateway's one event loop. The limits are the gateway's own config's (the file the service reads).

- A minute is a sliding window: the last 60 s before now, never a clock minute (a fixed one lets 2 x rpm through
  across its edge). A request counts when it is admitted; one refused, here or by the routing after (no server,
  the wait ran out, the client left), counts nothing. Its tokens count when its answer ends, at that time.
- A day runs from the policy zone's midnight to the next ([policy] timezone). What the project used before the
  gateway started comes from the service (gateway_state's tokens_today); from then on the gateway counts each answer
  as it ends, flushed to the service or not. A request is admitted while its project has tokens left, so the day's
  budget is passed by at most what the requests in flight at the last admission go on to use.
- Refused: 429 in OpenAI's error shape, with Retry-After the seconds until the limit lets a request through (for a
  day's budget, the next midnight); where several limits refuse, the one that frees last is named.
"""

from __future__ import annotations

import math
from collections import deque
from datetime import datetime
from typing import Any, Callable, NamedTuple

from app.config import Config
from app.core.policy import policy_zone
from app.core.projects import day
from app.core.text import zone_name
from app.gateway.routing import Refused

WINDOW_S = 60.0


class Window:
    """What one key or project did in the last WINDOW_S: its admissions and its tokens, each at its time."""

    def __init__(self) -> None:
        self.requests: deque[float] = deque()
        self.tokens: deque[tuple[float, int]] = deque()
        self.token_sum = 0

    def trim(self, now: float) -> None:
        while self.requests and self.requests[0] <= now - WINDOW_S:
            self.requests.popleft()
        while self.tokens and self.tokens[0][0] <= now - WINDOW_S:
            self.token_sum -= self.tokens.popleft()[1]

    def request_wait(self, now: float, rpm: int) -> float | None:
        """Seconds until a request fits under `rpm`; None when one fits now."""
        if len(self.requests) < rpm:
            return None
        return self.requests[0] + WINDOW_S - now  # the window never holds more than rpm: one free when the oldest leaves

    def token_wait(self, now: float, tpm: int) -> float | None:
        """Seconds until the tokens in the window are under `tpm`; None when they are now."""
        if self.token_sum < tpm:
            return None
        left = self.token_sum
        for at, tokens in self.tokens:  # the oldest leave first
            left -= tokens
            if left < tpm:
                return at + WINDOW_S - now
        return WINDOW_S  # not reached: the sum is the window's tokens


class Scope(NamedTuple):
    """One window a key's request counts in, with its limits: the key's own, or its project's."""
    window: Window
    rpm: int | None
    tpm: int | None
    who: str  # "key 3f2a..." or "project A's keys", for the refusal
    setting: str  # where the limits are set: "[gateway] key_" or "[[projects]] "
    code: str  # "key" or "project": the refusal's code is "key_requests_per_minute" and so on


class Admitted(NamedTuple):
    """A request's admission, for `Limits.cancel` when it is refused after all."""
    at: float
    windows: tuple[Window, ...]


class Limits:
    def __init__(self, config: Config, clock: Callable[[], float]) -> None:
        self.key_rpm, self.key_tpm = config.gateway.key_rpm, config.gateway.key_tpm
        self.projects = {p.name: p for p in config.projects}
        self.tz = policy_zone(config)
        self.clock = clock
        self.keys: dict[int, Window] = {}  # key id -> its window
        self.project_windows: dict[str, Window] = {}
        self.day = day(clock(), self.tz)  # (the last midnight, the next)
        self.spent: dict[str, int] = {}  # project -> its tokens this day
        self.seeded = False  # the service's count of the day before the gateway started is in `spent`

    def _scopes(self, key: dict[str, Any]) -> list[Scope]:
        """The windows a key's request counts in: the key's, and its project's (where they have limits)."""
        found = []
        if self.key_rpm is not None or self.key_tpm is not None:
            found.append(Scope(self.keys.setdefault(key["id"], Window()), self.key_rpm, self.key_tpm,
                               f"key {key['fingerprint']}", "[gateway] key_", "key"))
        project = self.projects.get(key.get("project") or "")
        if project is not None and (project.rpm is not None or project.tpm is not None):
            found.append(Scope(self.project_windows.setdefault(project.name, Window()), project.rpm, project.tpm,
                               f"project {project.name}'s keys", "[[projects]] ", "project"))
        return found

    def _roll(self, now: float) -> None:
        """A new day: each project's count starts at 0 (the gateway counted all of the day's tokens itself)."""
        if now >= self.day[1]:
            self.day, self.spent, self.seeded = day(now, self.tz), {}, True

    def seed(self, tokens_today: dict[str, Any] | None) -> None:
        """What the service has recorded for each project this day (gateway_state), taken once: at the first state
        of the day the gateway started in. From then on the gateway's own count is ahead of the service's, which
        only has what was flushed."""
        self._roll(self.clock())
        if self.seeded or not isinstance(tokens_today, dict) or tokens_today.get("since") != self.day[0]:
            return
        for project, tokens in (tokens_today.get("projects") or {}).items():
            if isinstance(tokens, int):
                self.spent[project] = self.spent.get(project, 0) + tokens
        self.seeded = True

    def admit(self, key: dict[str, Any]) -> Admitted:
        """Count the key's request, or Refused 429 naming the limit that frees last (nothing counted then)."""
        now = self.clock()
        self._roll(now)
        refusals: list[Refused] = []
        project = self.projects.get(key.get("project") or "")
        if project is not None and project.tokens_per_day is not None:
            spent = self.spent.get(project.name, 0)
            if spent >= project.tokens_per_day:
                reset = self.day[1]
                at = datetime.fromtimestamp(reset, self.tz).strftime("%a %H:%M")
                refusals.append(Refused(
                    429, f"project {project.name} has used {spent} of its {project.tokens_per_day} tokens for today"
                         f" ([[projects]] tokens_per_day); it starts again at midnight, {at} {zone_name(self.tz)}",
                    "rate_limit_exceeded", "project_tokens_per_day", retry_after=max(1, math.ceil(reset - now))))
        scopes = self._scopes(key)
        for scope in scopes:
            window = scope.window
            window.trim(now)
            if scope.rpm is not None and (wait := window.request_wait(now, scope.rpm)) is not None:
                refusals.append(_minute(f"{scope.who} made {len(window.requests)} requests in the last minute, the most"
                                        f" {scope.setting}rpm lets through", f"{scope.code}_requests_per_minute", wait))
            if scope.tpm is not None and (wait := window.token_wait(now, scope.tpm)) is not None:
                refusals.append(_minute(f"{scope.who} used {window.token_sum} tokens in the last minute;"
                                        f" {scope.setting}tpm is {scope.tpm}", f"{scope.code}_tokens_per_minute", wait))
        if refusals:
            raise max(refusals, key=lambda r: r.retry_after or 0)
        for scope in scopes:
            scope.window.requests.append(now)
        return Admitted(now, tuple(scope.window for scope in scopes))

    def cancel(self, admitted: Admitted) -> None:
        """A request refused after its admission (the routing's 404, 503 or 429, or the client left): it counts
        nothing."""
        for window in admitted.windows:
            if admitted.at in window.requests:
                window.requests.remove(admitted.at)

    def spend(self, key: dict[str, Any], tokens: int) -> None:
        """An answer's tokens (prompt and completion), counted as it ends."""
        if tokens <= 0:
            return
        now = self.clock()
        self._roll(now)
        project = key.get("project") or ""
        if project in self.projects:
            self.spent[project] = self.spent.get(project, 0) + tokens
        for scope in self._scopes(key):
            if scope.tpm is not None:
                scope.window.tokens.append((now, tokens))
                scope.window.token_sum += tokens


def _minute(said: str, code: str, wait: float) -> Refused:
    seconds = max(1, math.ceil(wait))
    return Refused(429, f"{said}; try again in {seconds} s", "rate_limit_exceeded", code, retry_after=seconds)
