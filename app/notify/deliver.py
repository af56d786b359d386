"""Sending the outbox: HTTP POSTs with urllib and a short timeout, on the delivery thread only.

The delivery thread reads and writes the outbox through `run_db` (in the service, a job on the
one database thread), and does its HTTP in between, on its own. So a slow or dead receiver holds up
other pushes at most, never an operation. A crash between a send and its record sends that row again:
pushes are at least once.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlsplit

from app.config import Config, NotifyTarget
from app.notify import outbox
from app.notify.formats import body

IDLE_WAIT_S = 60.0  # the longest the thread sleeps without looking at the clock (summaries, new rows)
ERROR_LIMIT = 200


@dataclass(frozen=True, slots=True)
class Outcome:
    status: int | None  # the HTTP status, None when no answer came
    error: str | None  # None when the target took the message; never holds the url
    retry: bool  # whether trying again later may help


def describe(target: NotifyTarget) -> str:
    """A target as messages name it: 'team (wecom, qyapi.weixin.qq.com)'; the url's path, query and user stay out."""
    try:
        parts = urlsplit(target.address())
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except (OSError, ValueError):
        host, port = "url_file unreadable", ""
    return f"{target.name} ({target.type}, {host}{port})"


def redact(text: str, target: NotifyTarget) -> str:
    """`text` without the url or its secret parts (path, query, user info), one short line."""
    try:
        url = target.address()
    except (OSError, ValueError):
        url = ""
    parts = urlsplit(url)
    for secret in sorted({url, parts.path, parts.query, parts.netloc, parts.username or "", parts.password or "",
                          *parts.query.split("&"), *(q.partition("=")[2] for q in parts.query.split("&"))},
                         key=len, reverse=True):
        if len(secret) >= 4:
            text = text.replace(secret, "<secret>")
    return " ".join(text.split())[:ERROR_LIMIT]


def send(target: NotifyTarget, data: bytes, timeout: float) -> Outcome:
    """POST `data` as JSON; a 2xx answer is success (and for WeCom, errcode 0 in its body)."""
    try:
        url = target.address()
    except OSError as error:  # the message names the file, which is no secret
        return Outcome(None, f"cannot read url_file: {error.strerror or type(error).__name__}", retry=True)
    except ValueError as error:
        return Outcome(None, str(error), retry=True)
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json; charset=utf-8",
                                              "User-Agent": "board-notify"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 - http(s) only, see config
            status, reply = answer.status, answer.read(4096)
    except urllib.error.HTTPError as error:
        permanent = 400 <= error.code < 500 and error.code not in (408, 429)
        return Outcome(error.code, redact(f"HTTP {error.code} {error.reason}", target), retry=not permanent)
    except (TimeoutError, socket.timeout):
        return Outcome(None, f"no answer within {timeout:g} s", retry=True)
    except urllib.error.URLError as error:
        return Outcome(None, redact(f"could not connect: {error.reason}", target), retry=True)
    except (OSError, ValueError, http.client.HTTPException) as error:  # a reset connection, a malformed answer
        return Outcome(None, redact(f"{type(error).__name__}: {error}", target), retry=True)
    if target.type == "wecom":  # the robot answers 200 with an errcode: 93000 bad key, 45009 rate limit
        try:
            code = json.loads(reply).get("errcode", 0)
        except (ValueError, AttributeError):
            code = 0
        if code:
            return Outcome(status, f"WeCom errcode {int(code) if isinstance(code, int) else '?'}",
                           retry=code in (45009, -1))
    return Outcome(status, None, retry=False)


class Deliverer:
    """Sends due outbox rows, retrying with backoff; `pass_once` is one round, `run` loops until `stopping`.

    `run_db(fn)` calls fn() where the database may be written (the service's database thread) and returns
    its result, and `conn()` is that thread's connection; `before` runs there at the start of each pass
    (the summary scheduler). The HTTP happens on the caller's thread, between those calls.
    """

    def __init__(self, config: Config, clock: Callable[[], float], run_db: Callable[[Callable[[], Any]], Any],
                 conn: Callable[[], Any], *, log: Callable[[str], None] = print,
                 send: Callable[[NotifyTarget, bytes, float], Outcome] = send,
                 before: Callable[[], object] | None = None) -> None:
        self.config, self.clock, self.run_db, self.conn, self.log = config, clock, run_db, conn, log
        self.send, self.before = send, before
        self.wake = threading.Event()
        # Since this service started, for its metrics: pushes a target took, tries that failed, pushes given up.
        self.counts = {"sent": 0, "failed_tries": 0, "given_up": 0}

    @property
    def targets(self) -> dict[str, NotifyTarget]:
        return {t.name: t for t in self.config.notify.targets}

    def pass_once(self) -> int:
        """Send what is due now; returns how many rows were tried."""
        if self.before is not None:
            self.run_db(self.before)
        tried = 0
        while rows := self.run_db(lambda: outbox.due(self.conn(), int(self.clock()))):
            for row in rows:
                self.deliver(row)
                tried += 1
        self.run_db(lambda: outbox.prune(self.conn(), int(self.clock())))
        return tried

    def deliver(self, row: outbox.Row) -> None:
        target = self.targets.get(row.target)
        if target is None:
            outcome = Outcome(None, "no such target in [[notify.targets]] any more", retry=False)
        else:
            outcome = self.send(target, body(target.type, row.message), self.config.notify.timeout_s)
        self.run_db(lambda: outbox.record(self.conn(), row, now=int(self.clock()), status=outcome.status,
                                          error=outcome.error, retry=outcome.retry))
        last = not outcome.retry or row.attempts + 1 >= row.max_attempts
        self.counts["sent" if outcome.error is None else "failed_tries"] += 1
        self.counts["given_up"] += outcome.error is not None and last
        if outcome.error is not None and target is not None:
            self.log(f"notify: {row.kind} #{row.id} to {describe(target)}: {outcome.error}"
                     f" ({'given up' if last else 'will retry'})")

    def run(self, stopping: threading.Event) -> None:
        while not stopping.is_set():
            try:
                self.pass_once()
                upcoming = self.run_db(lambda: outbox.next_due(self.conn()))
            except Exception as error:  # noqa: BLE001 - the delivery thread outlives one bad pass
                if stopping.is_set():
                    return  # the database thread has gone: what was sent and not recorded goes again next start
                self.log(f"notify: delivery pass failed: {type(error).__name__}")
                upcoming = None
            wait = IDLE_WAIT_S if upcoming is None else min(max(upcoming - self.clock(), 0.05), IDLE_WAIT_S)
            self.wake.wait(wait)
            self.wake.clear()
